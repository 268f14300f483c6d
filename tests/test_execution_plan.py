"""The execution plan: every choice the settings leave open (device, dtype, attention,
CUDA graphs, packed linears, context, KV blocks), made once for a checkpoint and a device
and logged in one line."""

import dataclasses
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvserve import LLM, SamplingParams
from kvserve.engine import execution_plan
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.kv_groups import KVGroup
from kvserve.engine.execution_plan import ExecutionPlan, plan_execution
from kvserve.engine.kernels import cpu_library
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig

from reference import assert_greedy_match, hf_greedy

# /proc/cpuinfo flag sets of the CPU kinds these machines have (abridged)
AVX2 = frozenset({"sse2", "avx", "avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
AVX512_BF16 = AVX512 | {"avx512_bf16"}
AMX = AVX512_BF16 | {"amx_tile", "amx_bf16", "amx_int8"}
AARCH64_BF16 = frozenset({"fp", "asimd", "bf16"})

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
        "dtype_note": "",
        "weights": "",  # 16-bit: not quantized
        "backend": "torch",
        "cuda_graphs": False,
        "cpu_graphs": False,  # the torch attention path is not the kernels'
        "packed_linears": True,  # oneDNN linears, float32 too
        "max_model_len": 100,
        "block_size": 16,
        "kv_cache_dtype": torch.float32,  # the model's (--kv-cache-dtype auto)
        "kv_block_bytes": FLOAT32_BLOCK_BYTES,
        "num_kv_blocks": 3 * 7,  # max_num_seqs full contexts of ceil(100 / 16) blocks
        # one: a dense model's layers, 2 kv heads x 16 elements a token each
        "kv_groups": (KVGroup("full_attention", None, (0, 1), 32),),
        "max_blocks_held_per_seq": 7,
        "max_num_seqs": 3,
        "max_num_batched_tokens": 2048,  # a CPU's default
        "num_state_slots": 0,  # no linear-attention layers
        "state_slot_bytes": 0,
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
    on_cpu = plan_execution(EngineConfig(model=path, device="cpu"), half, AVX512_BF16)
    on_cuda = plan_execution(EngineConfig(model=path, device="cuda"), half)
    eager = plan_execution(EngineConfig(model=path, device="cuda", enforce_eager=True), half)
    assert (on_cpu.dtype, on_cpu.cuda_graphs) == (torch.bfloat16, False)  # float16 is slow there
    assert on_cpu.cpu_graphs == cpu_library.available()  # the kernels' attention path
    eager_cpu = EngineConfig(model=path, device="cpu", enforce_eager=True)
    assert not plan_execution(eager_cpu, half, AVX512_BF16).cpu_graphs
    assert (on_cuda.dtype, on_cuda.backend.name, on_cuda.cuda_graphs) == (
        torch.float16,
        "triton",
        True,
    )
    assert (eager.backend.name, eager.cuda_graphs, eager.packed_linears) == ("triton", False, False)
    # a sliding window caps nothing: its blocks leave the cache as they leave the window
    windowed = dataclasses.replace(half, layer_windows=(64,) * half.num_layers)
    plan = plan_execution(EngineConfig(model=path, device="cpu"), windowed)
    assert plan.max_model_len == half.max_position_embeddings
    assert [(g.kind, g.window) for g in plan.kv_groups] == [("sliding_attention", 64)]
    # two KV groups: each has static buffers of its own in a captured or recorded step
    hybrid = dataclasses.replace(half, layer_windows=(64, None))
    on_cuda = plan_execution(EngineConfig(model=path, device="cuda"), hybrid)
    on_cpu = plan_execution(EngineConfig(model=path, device="cpu"), hybrid, AVX512_BF16)
    assert len(on_cuda.kv_groups) == 2 and on_cuda.cuda_graphs
    assert on_cpu.cpu_graphs == cpu_library.available()


def test_a_model_sharded_over_several_ranks_runs_every_step_eagerly(checkpoint, monkeypatch):
    """No CUDA graphs and no recorded CPU decode steps with collectives inside: never proven."""
    path = str(checkpoint("llama"))
    model_config = ModelConfig.from_dir(path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for device in ("cpu", "cuda"):
        config = EngineConfig(model=path, device=device, tensor_parallel_size=2)
        plan = plan_execution(config, model_config, AVX512_BF16)
        assert (plan.cuda_graphs, plan.cpu_graphs) == (False, False)
    one_rank = plan_execution(EngineConfig(model=path, device="cuda"), model_config)
    assert one_rank.cuda_graphs


@pytest.mark.parametrize(
    ("stored", "flags", "dtype", "note"),
    [
        ("bfloat16", AVX512_BF16, torch.bfloat16, ""),
        ("bfloat16", AMX, torch.bfloat16, ""),
        ("bfloat16", AARCH64_BF16, torch.bfloat16, ""),
        (
            "bfloat16",
            AVX2,
            torch.float32,
            "bfloat16 checkpoint upcast: this CPU has no native bf16",
        ),
        (
            "bfloat16",
            AVX512,
            torch.float32,
            "bfloat16 checkpoint upcast: this CPU has no native bf16",
        ),
        ("float16", AVX2, torch.float32, "float16 checkpoint upcast: this CPU has no native bf16"),
        ("float16", AMX, torch.bfloat16, "float16 checkpoint: bfloat16 is native on this CPU"),
        ("float32", AMX, torch.float32, ""),
        (None, AVX2, torch.float32, ""),
    ],
)
def test_auto_computes_in_bf16_only_where_the_cpu_does_it_natively(
    checkpoint, stored, flags, dtype, note
):
    path = str(checkpoint("llama"))
    model_config = dataclasses.replace(ModelConfig.from_dir(path), torch_dtype=stored)
    plan = plan_execution(EngineConfig(model=path, device="cpu"), model_config, flags)
    assert (plan.dtype, plan.dtype_note) == (dtype, note)
    assert f"dtype {str(dtype).removeprefix('torch.')}{f' ({note})' if note else ''}," in str(plan)


@pytest.mark.parametrize("flags", [AVX2, AVX512_BF16])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_an_explicit_dtype_is_obeyed_on_any_cpu(checkpoint, dtype, flags):
    path = str(checkpoint("llama"))
    config = EngineConfig(model=path, device="cpu", dtype=dtype)
    plan = plan_execution(config, ModelConfig.from_dir(path), flags)
    assert (plan.dtype, plan.dtype_note) == (getattr(torch, dtype), "")
    cuda = plan_execution(
        EngineConfig(model=path, device="cuda"),
        dataclasses.replace(ModelConfig.from_dir(path), torch_dtype="bfloat16"),
        AVX2,
    )
    assert cuda.dtype == torch.bfloat16  # the CPU's flags do not decide a GPU's dtype


def test_a_bf16_checkpoint_is_upcast_at_load_where_bf16_is_emulated(
    checkpoint, tmp_path, monkeypatch
):
    """On a CPU without native bf16 a bf16 checkpoint runs in float32: the same weights as
    transformers' float32 load of it, token for token."""
    source = str(checkpoint("llama"))
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp_path)
    monkeypatch.setattr(execution_plan, "cpu_flags", lambda: AVX2)
    llm = LLM(str(tmp_path), device="cpu", num_kv_blocks=16)
    assert (llm.engine.plan.dtype, llm.engine.plan.dtype_note) == (
        torch.float32,
        "bfloat16 checkpoint upcast: this CPU has no native bf16",
    )
    assert llm.engine.runner.kv_caches[0][0].dtype == torch.float32
    prompt = [5, 17, 200, 3, 41, 99, 7]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    got = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert_greedy_match(str(tmp_path), prompt, hf_greedy(str(tmp_path), prompt, 12), got)


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
        "cuda graphs off, cpu graphs off, packed linears on, max_model_len 100, "
        "21 KV blocks x 16 tokens"
    ]
    assert described(engine.plan) == described(plan_execution(config, engine.model_config))
    assert (engine.kv.pool.num_blocks, engine.runner.kv_caches[0][0].shape) == (
        21,
        (21, 16, 2, 16),
    )


def test_the_batch_limits_default_to_the_devices_and_a_setting_wins(checkpoint):
    path = str(checkpoint("llama"))
    model_config = ModelConfig.from_dir(path)

    def limits(device: str, **settings) -> tuple[int, int]:
        plan = plan_execution(EngineConfig(model=path, device=device, **settings), model_config)
        return plan.max_num_seqs, plan.max_num_batched_tokens

    assert limits("cuda") == (256, 8192)  # vLLM's on an H100
    assert limits("cpu") == (64, 2048)
    assert limits("cuda", max_num_seqs=64) == (64, 8192)
    assert limits("cuda", max_num_batched_tokens=2048) == (256, 2048)
    assert limits("cpu", max_num_seqs=8, max_num_batched_tokens=99) == (8, 99)
    assert EngineConfig(model=path).batch_limits("meta") == (64, 2048)
    # a CPU's default KV cache holds max_num_seqs full contexts: the device's when unset
    blocks_per_seq = -(-model_config.max_position_embeddings // 16)
    plan = plan_execution(EngineConfig(model=path, device="cpu", dtype="float32"), model_config)
    assert plan.num_kv_blocks == 64 * blocks_per_seq
