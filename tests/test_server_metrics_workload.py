"""The new vLLM metrics after a scripted workload on a real engine: exact values."""

from concurrent.futures import Future
from itertools import pairwise

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.structured.matcher import RequestGrammar
from kvserve.server.metrics import ServerMetrics
from kvserve.server.metrics_info import cache_config_labels

from factories import finish_step, make_request, make_scheduler


def engine_of(checkpoint, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(checkpoint("llama")), **settings))


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def run(engine: LLMEngine, metrics: ServerMetrics) -> dict:
    """Step until idle, observing every step; each request's token times, in order."""
    times: dict[str, list[float]] = {}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        metrics.on_step(engine.stats, outputs)
        for output in outputs:
            times.setdefault(output.request_id, []).append(output.last_token_time)
    return times


def sample(metrics: ServerMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def by_source(metrics: ServerMetrics) -> dict[str, float | None]:
    sources = ("local_compute", "local_cache_hit", "external_kv_transfer")
    return {s: sample(metrics, "vllm:prompt_tokens_by_source_total", source=s) for s in sources}


def test_a_prefix_hit_splits_prompt_tokens_by_source_and_each_later_token_is_one_latency(
    checkpoint,
):
    engine, metrics = engine_of(checkpoint, num_kv_blocks=64), ServerMetrics("m")
    shared = list(range(3, 35))  # two full blocks of 16
    engine.add_request("a", [*shared, *range(40, 48)], params(3))
    times = run(engine, metrics)
    engine.add_request("b", [*shared, *range(50, 58)], params(4))
    times |= run(engine, metrics)
    assert by_source(metrics) == {
        "local_compute": 40 + 8,
        "local_cache_hit": 32,
        "external_kv_transfer": 0,
    }
    assert sample(metrics, "vllm:prompt_tokens_total") == 80
    assert sample(metrics, "vllm:prompt_tokens_cached_total") == 32
    assert sample(metrics, "vllm:prefix_cache_hits_total") == 32
    gaps = [t - s for ts in times.values() for s, t in pairwise(ts)]
    assert len(gaps) == (3 - 1) + (4 - 1)
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert sample(metrics, name + "_count") == 5
        assert sample(metrics, name + "_sum") == pytest.approx(sum(gaps))
    means = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in times.values()]
    tpot = "vllm:request_time_per_output_token_seconds"
    assert sample(metrics, tpot + "_count") == 2
    assert sample(metrics, tpot + "_sum") == pytest.approx(sum(means))


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_kv_blocks=5),  # a 33-token prompt takes 3 of the 5 blocks
        dict(num_kv_blocks=64, max_num_batched_tokens=33),  # the first prompt takes the budget
        dict(num_kv_blocks=64, max_num_seqs=1),
    ],
    ids=["kv-blocks", "token-budget", "max-num-seqs"],
)
def test_requests_queued_behind_a_full_cache_or_budget_wait_for_capacity(checkpoint, settings):
    engine, metrics = engine_of(checkpoint, **settings), ServerMetrics("m")
    for name in "abc":
        engine.add_request(name, list(range(1, 34)), params(2))
    metrics.on_step(engine.stats, engine.step())
    waiting = {
        reason: sample(metrics, "vllm:num_requests_waiting_by_reason", reason=reason)
        for reason in ("capacity", "deferred")
    }
    assert (sample(metrics, "vllm:num_requests_running"), waiting) == (
        1,
        {"capacity": 2, "deferred": 0},
    )
    assert sample(metrics, "vllm:num_requests_waiting") == 2
    run(engine, metrics)
    assert sample(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 0


def test_a_request_whose_grammar_compiles_is_deferred_and_the_rest_wait_for_capacity():
    # 4 blocks of 4 tokens: the 12-token prompt of the first request leaves one free block.
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    first, blocked, compiling = make_request(12), make_request(12), make_request(2)
    compiling.grammar = RequestGrammar(Future())
    for request in (first, blocked, compiling):
        scheduler.add(request)
    metrics = ServerMetrics("m")
    out = scheduler.schedule()
    assert [r for r, _ in out.scheduled] == [first]
    metrics.on_step(scheduler.stats, [])
    assert sample(metrics, "vllm:num_requests_waiting") == 2
    assert sample(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
    assert sample(metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1
    finish_step(scheduler, out)
    assert scheduler.stats.num_waiting_deferred == 1


def test_cache_config_info_labels_are_the_engines_config_and_startup_phases_are_timed(
    checkpoint,
):
    engine = engine_of(checkpoint, num_kv_blocks=48, block_size=8, enable_prefix_caching=False)
    metrics = ServerMetrics("m")
    metrics.describe_engine(cache_config_labels(engine), engine.startup)
    labels = {
        "block_size": "8",
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "prefix_caching_hash_algo": "sha256",
        "kv_cache_memory_bytes": "None",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": "48",
        "num_gpu_blocks_override": "48",
        "kv_cache_size_tokens": str(48 * 8),
        "kv_cache_max_concurrency": str(48 / (512 // 8)),  # max_model_len 512
        "engine": "0",
    }
    assert cache_config_labels(engine) == labels
    assert metrics.registry.get_sample_value("vllm:cache_config_info", labels) == 1
    phases = {
        phase: sample(metrics, "kvserve:startup_phase_seconds", phase=phase)
        for phase in ("download", "load", "kv_alloc", "warmup")
    }
    assert phases == dict(engine.startup.items())
    assert phases["download"] == 0
    assert all(phases[p] > 0 for p in ("load", "kv_alloc", "warmup"))


def test_a_kv_budget_in_gib_is_reported_in_bytes_with_the_blocks_it_holds(checkpoint):
    engine = engine_of(checkpoint, kv_cache_memory_gb=0.001)
    labels = cache_config_labels(engine)
    assert labels["kv_cache_memory_bytes"] == str(int(0.001 * 2**30))
    assert labels["num_gpu_blocks"] == str(int(0.001 * 2**30) // engine.plan.kv_block_bytes)
    assert labels["num_gpu_blocks_override"] == "None"
