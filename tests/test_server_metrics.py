"""The exported metric names are vLLM V1's, exactly; ours are under ``kvserve:``."""

from kvserve.engine.outputs import CompletionOutput, RequestOutput
from kvserve.engine.scheduler import SchedulerStats
from kvserve.server.metrics import ServerMetrics

# name -> (type, labels), as vLLM V1 exports them (counters gain _total on the wire).
VLLM_V1 = {
    "vllm:num_requests_running": ("gauge", {"model_name"}),
    "vllm:num_requests_waiting": ("gauge", {"model_name"}),
    "vllm:kv_cache_usage_perc": ("gauge", {"model_name"}),
    "vllm:prefix_cache_queries": ("counter", {"model_name"}),
    "vllm:prefix_cache_hits": ("counter", {"model_name"}),
    "vllm:num_preemptions": ("counter", {"model_name"}),
    "vllm:prompt_tokens": ("counter", {"model_name"}),
    "vllm:generation_tokens": ("counter", {"model_name"}),
    "vllm:request_success": ("counter", {"model_name", "finished_reason"}),
    "vllm:time_to_first_token_seconds": ("histogram", {"model_name"}),
    "vllm:time_per_output_token_seconds": ("histogram", {"model_name"}),
    "vllm:e2e_request_latency_seconds": ("histogram", {"model_name"}),
    "vllm:request_queue_time_seconds": ("histogram", {"model_name"}),
}
OURS = {
    "kvserve:draining": ("gauge", {"model_name"}),
    "kvserve:requests_rejected": ("counter", {"model_name"}),
    "kvserve:engine_step_failures": ("counter", {"model_name"}),
}


def _families(metrics: ServerMetrics) -> dict:
    found = {}
    for family in metrics.registry.collect():
        labels = set().union(*(s.labels.keys() for s in family.samples)) - {"le"}
        found[family.name] = (family.type, labels)
    return found


def test_exported_names_types_and_labels_are_the_golden_list():
    assert _families(ServerMetrics("m")) == VLLM_V1 | OURS


def _sample(metrics: ServerMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def test_values_follow_steps_and_finished_requests():
    metrics = ServerMetrics("m")
    stats = SchedulerStats(3, 2, 0.25, prefix_cache_queries=40, prefix_cache_hits=16)

    def output(tokens: int, finished: bool, reason=None) -> RequestOutput:
        completion = CompletionOutput(0, list(range(tokens)), "", reason)
        return RequestOutput(
            "r", None, [1] * 10, [completion], finished, arrival_time=1.0,
            first_scheduled_time=1.5, first_token_time=2.0, finished_time=4.0,
        )  # fmt: skip

    metrics.on_step(stats, [output(1, False)])
    metrics.on_step(stats, [output(5, True, "length")])
    metrics.on_abort("other")
    assert _sample(metrics, "vllm:num_requests_running") == 3
    assert _sample(metrics, "vllm:num_requests_waiting") == 2
    assert _sample(metrics, "vllm:kv_cache_usage_perc") == 0.25
    assert _sample(metrics, "vllm:prefix_cache_queries_total") == 40
    assert _sample(metrics, "vllm:prefix_cache_hits_total") == 16
    assert _sample(metrics, "vllm:prompt_tokens_total") == 10
    assert _sample(metrics, "vllm:generation_tokens_total") == 5
    assert _sample(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert _sample(metrics, "vllm:request_success_total", finished_reason="abort") == 1
    assert _sample(metrics, "vllm:e2e_request_latency_seconds_sum") == 3.0
    assert _sample(metrics, "vllm:request_queue_time_seconds_sum") == 0.5
    assert _sample(metrics, "vllm:time_to_first_token_seconds_sum") == 1.0
    assert _sample(metrics, "vllm:time_per_output_token_seconds_sum") == 0.5
    assert b'vllm:num_requests_running{model_name="m"} 3.0' in metrics.exposition()
