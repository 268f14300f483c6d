"""The metrics the API serves: the HPA-facing name, the exposition name it is read from.

Pods export vLLM's names (``vllm:num_requests_waiting``, server/metrics.py); a colon is not a
safe character in a custom-metrics resource path, so the API serves them with ``vllm_``, the
same names the prometheus-adapter rules expose and the operator's HPA asks for.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvserve.operator.autoscaler import KV_USAGE_METRIC, WAITING_METRIC

RUNNING_METRIC = "vllm_num_requests_running"


@dataclass(frozen=True)
class ServedMetric:
    name: str
    """The name in the API path (``pods/<name>``) and in ``metricName``."""
    exposition: str
    """The Prometheus family the pod exports."""
    combine: Callable[[Iterable[float]], float]
    """How the samples of the family (one per ``model_name``) become the pod's value."""


SERVED_METRICS: dict[str, ServedMetric] = {
    m.name: m
    for m in (
        ServedMetric(WAITING_METRIC, "vllm:num_requests_waiting", sum),
        ServedMetric(RUNNING_METRIC, "vllm:num_requests_running", sum),
        ServedMetric(KV_USAGE_METRIC, "vllm:kv_cache_usage_perc", max),
    )
}
