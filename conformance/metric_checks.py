"""The metrics an endpoint picker scrapes from ``/metrics``.

The Gateway API Inference Extension's model-server protocol
(docs/proposals/003-model-server-protocol) requires three gauges and names vLLM's metric for
each; the llm-d endpoint picker reads exactly those names for a pod of engine type ``vllm``
(its default). A picker takes a sample's value only from a gauge or a counter (any other
type reads as 0), so the type is checked as well as the name. ``vllm:cache_config_info`` is
optional in the protocol: without it the prefix-cache scorer takes the block size and the
block count from its own configuration.
"""

import math
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvserve.conformance.report import plural

Families = dict[str, Metric]


@dataclass(frozen=True)
class GaugeRule:
    name: str
    protocol_name: str
    fraction: bool
    """True: a value in [0, 1] (1 is 100%); False: a count of requests, an integer >= 0."""

    @property
    def meaning(self) -> str:
        return "a fraction in [0, 1]" if self.fraction else "a count >= 0"

    def accepts(self, value: float) -> bool:
        if self.fraction:
            return 0.0 <= value <= 1.0
        return math.isfinite(value) and value >= 0 and value == int(value)


REQUIRED_GAUGES = (
    GaugeRule("vllm:num_requests_waiting", "TotalQueuedRequests", fraction=False),
    GaugeRule("vllm:num_requests_running", "TotalRunningRequests", fraction=False),
    GaugeRule("vllm:kv_cache_usage_perc", "KVCacheUtilization", fraction=True),
)
CACHE_INFO = "vllm:cache_config_info"
CACHE_INFO_LABELS = ("block_size", "num_gpu_blocks")


def parse_metrics(text: str) -> Families:
    """Families by name, as prometheus_client's text parser reads them; ``ValueError`` when
    the text is not the Prometheus text format."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def _gauge_problem(families: Families, name: str, what: str) -> str | None:
    family = families.get(name)
    if family is None:
        return f"not on /metrics ({what})"
    if family.type != "gauge":
        return f"type {family.type}; the protocol needs a gauge"
    if not family.samples:
        return "declared but has no samples"
    return None


def check_gauge(families: Families, rule: GaugeRule) -> tuple[bool, str]:
    problem = _gauge_problem(families, rule.name, f"the picker reads {rule.protocol_name} there")
    if problem:
        return False, problem
    samples = families[rule.name].samples
    for sample in samples:
        if not rule.accepts(sample.value):
            return False, f"sample {sample.labels} = {sample.value} is not {rule.meaning}"
    return True, f"gauge ({rule.protocol_name}), {plural(len(samples), 'sample')}, {rule.meaning}"


def check_cache_info(families: Families) -> tuple[bool, str, int | None]:
    """Also returns the block size it announces (None when it announces none)."""
    fallback = "the prefix-cache scorer falls back to its own block size and block count"
    problem = _gauge_problem(families, CACHE_INFO, fallback)
    if problem:
        return False, problem, None
    labels = families[CACHE_INFO].samples[0].labels
    values = {}
    for label in CACHE_INFO_LABELS:
        text = labels.get(label)
        if text is None:
            return False, f"no label {label} (labels: {', '.join(sorted(labels))})", None
        if not text.isdigit() or int(text) == 0:
            return False, f"{label}={text!r} is not a positive integer", None
        values[label] = int(text)
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return True, f"gauge, {shown}", values["block_size"]
