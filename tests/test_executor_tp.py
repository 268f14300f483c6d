"""Tensor parallelism on a CPU: two ranks (rank 0 in this process, rank 1 a gloo worker
process, one thread each) give transformers' greedy tokens for every family, with chunked
prefill, prefix caching and preemption, every block accounted for after every step; and the
engine stops its worker when it shuts down."""

import pytest

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.executor.multiproc import MultiprocExecutor
from kvserve.engine.llm_engine import LLMEngine

from faults import gone
from pressure_run import assert_arrivals_match_transformers


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen2_moe"])
def test_two_ranks_give_transformers_tokens_under_block_pressure(checkpoint, family):
    path = str(checkpoint(family))
    engine = LLMEngine(
        EngineConfig(
            model=path,
            dtype="float32",
            block_size=4,
            num_kv_blocks=24,
            max_num_batched_tokens=24,
            max_num_seqs=6,
            enable_prefix_caching=True,
            tensor_parallel_size=2,
        )
    )
    executor = engine.runner
    assert isinstance(executor, MultiprocExecutor)
    assert executor.runner.tp.size == 2 and len(executor.pids) == 1
    assert engine.plan.cpu_graphs is False
    try:
        assert_arrivals_match_transformers(engine, path, 20)
    finally:
        engine.shutdown()
    assert all(gone(pid) for pid in executor.pids)


def test_the_offline_api_takes_the_tensor_parallel_size(checkpoint):
    from kvserve import LLM

    path = str(checkpoint("llama"))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    single = LLM(path, dtype="float32", num_kv_blocks=32)
    try:
        want = single.generate("def f(x):", params)[0].outputs[0].token_ids
    finally:
        single.engine.shutdown()
    llm = LLM(path, dtype="float32", num_kv_blocks=32, tensor_parallel_size=2)
    executor = llm.engine.runner
    try:
        assert llm.generate("def f(x):", params)[0].outputs[0].token_ids == want
    finally:
        llm.engine.shutdown()
    assert isinstance(executor, MultiprocExecutor) and all(gone(p) for p in executor.pids)


def test_the_backend_defaults_to_the_rank_count_and_uni_refuses_several():
    assert EngineConfig(model="/m").distributed_executor_backend == "uni"
    assert EngineConfig(model="/m", tensor_parallel_size=2).distributed_executor_backend == "mp"
    with pytest.raises(ValueError, match="uni runs one rank, not tensor_parallel_size 2; use mp"):
        EngineConfig(model="/m", tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="must be one of"):
        EngineConfig(model="/m", distributed_executor_backend="ray")
