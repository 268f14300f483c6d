"""The Prometheus operator's PodMonitor for an LLMDeployment's pods (where that API exists).

Clusters without the Prometheus operator scrape the same endpoint through the pods'
``prometheus.io/*`` annotations instead.
"""

from typing import Any

from kvserve.operator.discovery import POD_MONITOR_VERSION
from kvserve.operator.resource import child_metadata, selector_labels


def render_pod_monitor(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": POD_MONITOR_VERSION,
        "kind": "PodMonitor",
        "metadata": child_metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner["metadata"]["name"])},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }
