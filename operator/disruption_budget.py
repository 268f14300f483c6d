"""The PodDisruptionBudget: voluntary evictions (node drains) take one serving pod at a time."""

from typing import Any

from kvserve.operator.resource import child_metadata, selector_labels


def render_pdb(owner: dict[str, Any], api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner["metadata"]["name"])},
        },
    }
