"""The HorizontalPodAutoscaler that scales an LLMDeployment's Deployment (or LeaderWorkerSet) on
queue depth.

The metrics are per-pod averages served by the custom-metrics API: by kvserve's own
(``metrics_api``, which scrapes the pods' ``/metrics``), or by prometheus-adapter with the
chart's rules. Pods export ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``; both
servers expose them as ``vllm_num_requests_waiting`` and ``vllm_kv_cache_usage_perc`` (the
``vllm:`` prefix becomes ``vllm_``: a colon is not a safe character in a custom-metrics
resource path; ``metrics_api.catalog`` imports these names to serve them). ``autoscaling/v2``
and ``v2beta2`` share this shape; discovery picks the version.
"""

from typing import Any

from kvserve.operator.resource import child_metadata
from kvserve.operator.spec import AutoscalingSpec

WAITING_METRIC = "vllm_num_requests_waiting"
KV_USAGE_METRIC = "vllm_kv_cache_usage_perc"


def _pods_metric(name: str, average: str) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": name},
            "target": {"type": "AverageValue", "averageValue": average},
        },
    }


def render_hpa(
    owner: dict[str, Any],
    scaling: AutoscalingSpec,
    api_version: str,
    target: tuple[str, str] = ("apps/v1", "Deployment"),
) -> dict[str, Any]:
    """``target``: (apiVersion, kind) of the workload whose scale subresource the HPA sets: the
    Deployment, or the LeaderWorkerSet (whose scale counts groups; its selector, the leaders)."""
    metrics = []
    if scaling.target_waiting_requests is not None:
        metrics.append(_pods_metric(WAITING_METRIC, str(scaling.target_waiting_requests)))
    if scaling.target_kv_cache_usage is not None:
        milli = round(scaling.target_kv_cache_usage * 1000)
        metrics.append(_pods_metric(KV_USAGE_METRIC, f"{milli}m"))
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(owner),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": target[0],
                "kind": target[1],
                "name": owner["metadata"]["name"],
            },
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": metrics,
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": scaling.scale_down_stabilization_seconds
                }
            },
        },
    }
