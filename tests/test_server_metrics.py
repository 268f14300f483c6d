"""The exported metric names are vLLM V1's, exactly; ours are under ``kvserve:``."""

import time

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.registry import Collector

from kvserve.engine.core.outputs import CompletionOutput, RequestOutput
from kvserve.engine.core.scheduler import SchedulerStats
from kvserve.engine.startup import StartupPhases
from kvserve.server.metrics import ServerMetrics
from kvserve.server.metrics_snapshot import ExpositionSnapshot

# name -> (type, labels), as vLLM V1 exports them (counters gain _total on the wire).
VLLM_V1 = {
    "vllm:num_requests_running": ("gauge", {"model_name"}),
    "vllm:num_requests_waiting": ("gauge", {"model_name"}),
    "vllm:num_requests_waiting_by_reason": ("gauge", {"model_name", "reason"}),
    "vllm:kv_cache_usage_perc": ("gauge", {"model_name"}),
    "vllm:prefix_cache_queries": ("counter", {"model_name"}),
    "vllm:prefix_cache_hits": ("counter", {"model_name"}),
    "vllm:num_preemptions": ("counter", {"model_name"}),
    "vllm:prompt_tokens": ("counter", {"model_name"}),
    "vllm:prompt_tokens_by_source": ("counter", {"model_name", "source"}),
    "vllm:prompt_tokens_cached": ("counter", {"model_name"}),
    "vllm:generation_tokens": ("counter", {"model_name"}),
    "vllm:request_success": ("counter", {"model_name", "finished_reason"}),
    "vllm:time_to_first_token_seconds": ("histogram", {"model_name"}),
    "vllm:time_per_output_token_seconds": ("histogram", {"model_name"}),
    "vllm:inter_token_latency_seconds": ("histogram", {"model_name"}),
    "vllm:request_time_per_output_token_seconds": ("histogram", {"model_name"}),
    "vllm:e2e_request_latency_seconds": ("histogram", {"model_name"}),
    "vllm:request_queue_time_seconds": ("histogram", {"model_name"}),
}
CACHE_CONFIG = {"block_size": "16", "num_gpu_blocks": "64", "engine": "0"}
# Set once the engine is built (vLLM registers cache_config_info then too).
ENGINE_INFO = {
    "vllm:cache_config_info": ("gauge", set(CACHE_CONFIG)),
    "kvserve:startup_phase_seconds": ("gauge", {"model_name", "phase"}),
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
    metrics = ServerMetrics("m")
    assert _families(metrics) == VLLM_V1 | OURS
    metrics.describe_engine(CACHE_CONFIG, StartupPhases(0.0, 1.5, 0.25, 0.5))
    assert _families(metrics) == VLLM_V1 | OURS | ENGINE_INFO
    assert metrics.registry.get_sample_value("vllm:cache_config_info", CACHE_CONFIG) == 1
    phases = {p: _sample(metrics, "kvserve:startup_phase_seconds", phase=p) for p in STARTUP}
    assert phases == {"download": 0.0, "load": 1.5, "kv_alloc": 0.25, "warmup": 0.5}
    assert b'kvserve:startup_phase_seconds{model_name="m",phase="load"} 1.5' in (
        metrics.exposition()
    )


STARTUP = ("download", "load", "kv_alloc", "warmup")


# vllm/v1/metrics/loggers.py: inter-token latency and time per output token; request latency.
VLLM_TOKEN_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
VLLM_REQUEST_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip


def test_latency_histograms_have_vllms_buckets():
    metrics = ServerMetrics("m")
    for name, buckets in (
        ("vllm:inter_token_latency_seconds", VLLM_TOKEN_BUCKETS),
        ("vllm:time_per_output_token_seconds", VLLM_TOKEN_BUCKETS),
        ("vllm:request_time_per_output_token_seconds", VLLM_TOKEN_BUCKETS),
        ("vllm:e2e_request_latency_seconds", VLLM_REQUEST_BUCKETS),
        ("vllm:request_queue_time_seconds", VLLM_REQUEST_BUCKETS),
    ):
        bounds = [
            float(s.labels["le"])
            for f in metrics.registry.collect()
            if f.name == name
            for s in f.samples
            if s.name.endswith("_bucket")
        ]
        assert bounds == [*buckets, float("inf")], name


def _sample(metrics: ServerMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def test_values_follow_steps_and_finished_requests():
    metrics = ServerMetrics("m")
    stats = SchedulerStats(3, 2, 0.25, prefix_cache_queries=40, prefix_cache_hits=16)

    def output(tokens: int, last_token_time: float, finished=False, reason=None):
        completion = CompletionOutput(0, [tokens - 1], "", reason, num_output_tokens=tokens)
        return RequestOutput(
            "r", None, [1] * 10, [completion], finished, num_cached_tokens=4,
            arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0,
            last_token_time=last_token_time, finished_time=4.0 if finished else None,
        )  # fmt: skip

    metrics.on_step(stats, [output(1, 2.0)])
    metrics.on_step(stats, [output(2, 2.5)])
    metrics.on_step(stats, [output(3, 3.5, True, "length")])
    metrics.on_abort("other", stats, 1)
    assert _sample(metrics, "vllm:num_requests_running") == 3
    assert _sample(metrics, "vllm:num_requests_waiting") == 2
    assert _sample(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 2
    assert _sample(metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert _sample(metrics, "vllm:kv_cache_usage_perc") == 0.25
    assert _sample(metrics, "vllm:prefix_cache_queries_total") == 40
    assert _sample(metrics, "vllm:prefix_cache_hits_total") == 16
    assert _sample(metrics, "vllm:prompt_tokens_total") == 10
    by_source = {
        s: _sample(metrics, "vllm:prompt_tokens_by_source_total", source=s)
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert by_source == {"local_compute": 6, "local_cache_hit": 4, "external_kv_transfer": 0}
    assert _sample(metrics, "vllm:prompt_tokens_cached_total") == 4
    assert _sample(metrics, "vllm:generation_tokens_total") == 3
    assert _sample(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert _sample(metrics, "vllm:request_success_total", finished_reason="abort") == 1
    assert _sample(metrics, "vllm:e2e_request_latency_seconds_sum") == 3.0
    assert _sample(metrics, "vllm:request_queue_time_seconds_sum") == 0.5
    assert _sample(metrics, "vllm:time_to_first_token_seconds_sum") == 1.0
    # one interval per token after the first (0.5 s, then 1.0 s); the request's mean: 0.75 s
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert (_sample(metrics, name + "_count"), _sample(metrics, name + "_sum")) == (2, 1.5)
        assert _sample(metrics, name + "_bucket", le="0.5") == 1
    tpot = "vllm:request_time_per_output_token_seconds"
    assert (_sample(metrics, tpot + "_count"), _sample(metrics, tpot + "_sum")) == (1, 0.75)
    metrics.snapshot.rebuild()
    assert b'vllm:num_requests_running{model_name="m"} 3.0' in metrics.exposition()


def test_waiting_requests_split_by_reason_and_sum_to_the_waiting_gauge():
    metrics = ServerMetrics("m")
    metrics.on_step(SchedulerStats(1, 5, 0.5, num_waiting_deferred=2), [])
    assert _sample(metrics, "vllm:num_requests_waiting") == 5
    assert _sample(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert _sample(metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 2


def test_an_idle_engines_scrape_is_fresh_without_the_snapshot_thread():
    metrics = ServerMetrics("m")
    metrics.on_step(SchedulerStats(0, 0, prefix_cache_hits=48), [])
    assert b'vllm:prefix_cache_hits_total{model_name="m"} 48.0' in metrics.exposition()
    assert not metrics.snapshot.stale


def test_an_abort_and_the_gauges_it_lowers_show_together():
    metrics = ServerMetrics("m")
    metrics.on_step(SchedulerStats(1, 0, 0.5), [])
    metrics.snapshot.rebuild()
    metrics.on_abort("r", SchedulerStats(0, 0, 0.0), 1)
    body = metrics.exposition()
    assert b'vllm:request_success_total{finished_reason="abort",model_name="m"} 1.0' in body
    assert b'vllm:num_requests_running{model_name="m"} 0.0' in body
    assert b'vllm:kv_cache_usage_perc{model_name="m"} 0.0' in body


def test_a_rebuild_that_an_update_overlapped_is_formatted_again():
    """An update lands while ``first`` is already formatted: that text is dropped, so no
    body shows one half of an update without the other."""
    registry = CollectorRegistry()
    first = Counter("first", "", registry=registry)
    snapshot = ExpositionSnapshot(registry)

    class Interloper(Collector):
        calls = 0

        def collect(self):
            self.calls += 1
            if self.calls == 1:
                with snapshot.update():
                    first.inc()
            return []

    interloper = Interloper()
    registry.register(interloper)
    snapshot.rebuild()
    assert interloper.calls == 2
    assert b"first_total 1.0" in snapshot.body
    assert not snapshot.stale


def test_the_snapshot_shows_a_step_only_once_rebuilt_and_its_thread_rebuilds_it():
    metrics = ServerMetrics("m")
    line = b'vllm:num_requests_waiting{model_name="m"} 7.0'
    metrics.on_step(SchedulerStats(0, 7), [])
    assert line not in metrics.exposition()
    metrics.snapshot.start()
    try:
        metrics.on_step(SchedulerStats(0, 7), [])
        deadline = time.monotonic() + 5
        while line not in metrics.exposition():
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        metrics.snapshot.stop()
