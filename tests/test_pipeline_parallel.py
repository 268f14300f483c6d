"""Pipeline parallelism on one node: two stages (rank 0 in this process, rank 1 a worker
process) give transformers' greedy tokens for a dense, a tied-embedding and a MoE model with
chunked prefill, prefix caching and preemption; each stage holds its contiguous layers and
their KV pages alone; a model whose step is not the shared decoder's is refused by name."""

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.engine.execution_plan import plan_execution
from kvserve.engine.executor.multiproc import MultiprocExecutor
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.decoder import MissingLayer
from kvserve.engine.models.model_config import ModelConfig

from faults import gone
from hybrid_checkpoints import build_qwen3_next
from pressure_run import assert_arrivals_match_transformers


@pytest.mark.parametrize("family", ["llama", "llama3-tied", "qwen3_moe"])
def test_two_stages_give_transformers_tokens_under_block_pressure(checkpoint, family):
    path = str(checkpoint(family))
    engine = LLMEngine(
        EngineConfig(
            model=path,
            dtype="float32",
            block_size=4,
            num_kv_blocks=24,
            max_num_batched_tokens=24,
            max_num_seqs=6,
            pipeline_parallel_size=2,
        )
    )
    executor = engine.runner
    assert isinstance(executor, MultiprocExecutor) and len(executor.pids) == 1
    try:
        assert_arrivals_match_transformers(engine, path, 12)
    finally:
        engine.shutdown()
    assert all(gone(pid) for pid in executor.pids)


def test_the_first_stage_holds_its_layers_and_their_kv_pages_alone(checkpoint):
    path = str(checkpoint("qwen3_moe"))  # 3 layers: stage 0 runs 0 and 1, stage 1 runs 2
    engine = LLMEngine(EngineConfig(model=path, num_kv_blocks=16, pipeline_parallel_size=2))
    try:
        runner = engine.runner.runner
        model = runner.model
        assert model.stage == range(0, 2)
        assert [isinstance(layer, MissingLayer) for layer in model.layers] == [
            False,
            False,
            True,
        ]
        assert not isinstance(model.embed_tokens, MissingLayer)
        assert isinstance(model.lm_head, MissingLayer) and isinstance(model.norm, MissingLayer)
        assert [k.numel() > 0 for k, _ in runner.kv_caches] == [True, True, False]
        whole = plan_execution(EngineConfig(model=path), ModelConfig.from_dir(path))
        assert engine.plan.kv_block_bytes * 3 == whole.kv_block_bytes * 2
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("layers", "stages", "split"),
    [
        (2, 2, [range(0, 1), range(1, 2)]),
        (3, 2, [range(0, 2), range(2, 3)]),
        (7, 3, [range(0, 2), range(2, 5), range(5, 7)]),
        (8, 3, [range(0, 3), range(3, 6), range(6, 8)]),
    ],
)
def test_stages_take_contiguous_layers_the_remainder_before_the_last(layers, stages, split):
    assert [PipelineParallel(r, stages).layers(layers) for r in range(stages)] == split


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 is more than the model's 2"):
        PipelineParallel(0, 3).layers(2)


def test_a_hybrid_model_is_refused_by_name(tmp_path):
    path = str(build_qwen3_next(tmp_path / "qwen3-next"))
    with pytest.raises(
        ValueError,
        match=r"pipeline_parallel_size 2: Qwen3NextForCausalLM \(family qwen3_next\) cannot be "
        "split in pipeline stages",
    ):
        LLMEngine(EngineConfig(model=path, num_kv_blocks=16, pipeline_parallel_size=2))
