"""The execution plan: every choice the settings leave open (device, dtype, attention,
CUDA graphs, packed linears, context, KV blocks), made once for a checkpoint and a device
and logged in one line."""

import dataclasses
import logging

import pytest
import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.execution_plan import ExecutionPlan, plan_execution
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig

# The tiny llama: 2 layers x (keys, values) x 2 KV heads x 16 dims
FLOAT32_BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # 16 tokens of float32


def described(plan: ExecutionPlan) -> dict:
    """The plan's fields, its attention backend by name."""
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    return fields | {"backend": plan.backend.name}


def test_a_tiny_checkpoint_on_the_cpu_gets_an_exact_plan(checkpoint):
    path = str(checkpoint("llama"))
    config = EngineConfig(
        model=path, device="cpu", attention_backend="torch", max_model_len=100, max_num_seqs=3
    )
    plan = plan_execution(config, ModelConfig.from_dir(path))
    assert described(plan) == {
        "model": path,
        "family": "llama",
        "device": torch.device("cpu"),
        "dtype": torch.float32,  # the checkpoint's
        "backend": "torch",
        "cuda_graphs": False,
        "packed_linears": False,  # float32 stays on plain torch
        "max_model_len": 100,
        "block_size": 16,
        "kv_block_bytes": FLOAT32_BLOCK_BYTES,
        "num_kv_blocks": 3 * 7,  # max_num_seqs full contexts of ceil(100 / 16) blocks
    }
    assert plan.max_blocks_per_seq == 7


def test_the_kv_blocks_follow_the_setting_that_wins(checkpoint):
    path = str(checkpoint("llama"))
    model_config = ModelConfig.from_dir(path)

    def blocks(**settings) -> int | None:
        return plan_execution(EngineConfig(model=path, **settings), model_config).num_kv_blocks

    assert blocks(device="cpu") == 64 * 32  # 64 full contexts of 512 tokens
    assert blocks(device="cpu", kv_cache_memory_gb=1 / 1024) == 2**20 // FLOAT32_BLOCK_BYTES
    assert blocks(device="cpu", kv_cache_memory_gb=1 / 1024, num_kv_blocks=5) == 5
    # On CUDA the share of memory a profiled step leaves: measured once the model is loaded
    assert blocks(device="cuda") is None
    assert blocks(device="cuda", num_kv_blocks=5) == 5


def test_the_checkpoint_and_the_device_decide_what_auto_means(checkpoint):
    path = str(checkpoint("llama"))
    half = dataclasses.replace(ModelConfig.from_dir(path), torch_dtype="float16")
    on_cpu = plan_execution(EngineConfig(model=path, device="cpu"), half)
    on_cuda = plan_execution(EngineConfig(model=path, device="cuda"), half)
    eager = plan_execution(EngineConfig(model=path, device="cuda", enforce_eager=True), half)
    assert (on_cpu.dtype, on_cpu.cuda_graphs) == (torch.bfloat16, False)  # float16 is slow there
    assert (on_cuda.dtype, on_cuda.backend.name, on_cuda.cuda_graphs) == (
        torch.float16,
        "triton",
        True,
    )
    assert (eager.backend.name, eager.cuda_graphs, eager.packed_linears) == ("triton", False, False)
    windowed = dataclasses.replace(half, sliding_window=64)
    assert plan_execution(EngineConfig(model=path, device="cpu"), windowed).max_model_len == 64
    with pytest.raises(ValueError, match=r"^max_model_len 100 exceeds the model's context of 64$"):
        plan_execution(EngineConfig(model=path, device="cpu", max_model_len=100), windowed)


def test_the_engine_runs_and_logs_its_plan_in_one_line(checkpoint, caplog):
    path = str(checkpoint("llama"))
    config = EngineConfig(
        model=path, device="cpu", attention_backend="torch", max_model_len=100, max_num_seqs=3
    )
    with caplog.at_level(logging.INFO):
        engine = LLMEngine(config)
    plan_lines = [r.getMessage() for r in caplog.records if "KV blocks" in r.getMessage()]
    assert plan_lines == [
        f"execution plan: {path} (llama): device cpu, dtype float32, attention torch, "
        "cuda graphs off, packed linears off, max_model_len 100, 21 KV blocks x 16 tokens"
    ]
    assert described(engine.plan) == described(plan_execution(config, engine.model_config))
    assert (engine.kv.pool.num_blocks, engine.runner.kv_caches[0][0].shape) == (
        21,
        (21, 16, 2, 16),
    )
