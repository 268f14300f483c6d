"""``--kv-cache-dtype fp8`` through the engine: the cache is e4m3 on every attention backend,
twice the blocks fit a budget, the plan line and ``vllm:cache_config_info`` say so, the
model stays within a stated tolerance of transformers, two ranks give one rank's tokens,
and a checkpoint's k/v scales are the ones the cache is written with; a scale or a GPU that
cannot serve is refused.

The tolerance rule (``LOGPROB_TOLERANCE``): at every position (each prompt token after the
first, each generated token) the log-probability of its token is within 0.15 of
transformers' (float32, no KV quantization) after the same tokens; e4m3 keeps 3 mantissa
bits, and on these tiny random models the largest difference seen was 0.1. A difference in
two tokens' log-probabilities is the difference of their logits, so an error within the
tolerance moves a top-2 gap by at most twice it: wherever transformers' top-2 gap exceeds
2 x 0.15, the engine's first choice there (its greedy token; its top alternative at a prompt
position) must be transformers' (transformers reads the engine's own tokens, so one
near-tie does not decide every later position).
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve import LLM, SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.execution_plan import plan_execution
from kvserve.engine.layers.attention.fp8_kv import FP8, KVScales, quantize
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig
from kvserve.server.metrics_info import cache_config_labels

from reference import hf_model

LOGPROB_TOLERANCE = 0.15
PROMPT_LENS = (48, 23, 70)


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(1, 512, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def run_engine(engine: LLMEngine, max_tokens: int) -> dict[str, tuple[list[int], list]]:
    """Each prompt's greedy tokens and the Logprob of every position after its first (the
    prompt's, then the generated tokens'), each with the engine's first choice there."""
    params = SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1, prompt_logprobs=1
    )
    for i, prompt in enumerate(prompts()):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                logprobs[out.request_id] = list(out.prompt_logprobs[1:])
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
            logprobs[out.request_id].extend(out.outputs[0].logprobs or ())
    return {r: (tokens[r], logprobs[r]) for r in tokens}


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
def test_fp8_kv_stays_within_the_tolerance_of_transformers(checkpoint, backend):
    path = str(checkpoint("llama"))
    engine = LLMEngine(
        EngineConfig(
            model=path,
            dtype="float32",
            kv_cache_dtype="fp8",
            attention_backend=backend,
            num_kv_blocks=64,
        )
    )
    assert all(k.dtype == v.dtype == FP8 for k, v in engine.runner.kv_caches)
    max_tokens = 2 if backend == "triton" else 8  # the interpreter is slow
    results = run_engine(engine, max_tokens)
    checked = 0
    for i, prompt in enumerate(prompts()):
        tokens, logprobs = results[str(i)]
        sequence = prompt + tokens
        with torch.no_grad():
            logits = hf_model(path)(torch.tensor([sequence])).logits[0, :-1].float()
        reference = torch.log_softmax(logits, dim=-1)
        expected = reference[torch.arange(len(sequence) - 1), torch.tensor(sequence[1:])]
        got = torch.tensor([lp.logprob for lp in logprobs])
        error = (got - expected).abs().max().item()
        assert error <= LOGPROB_TOLERANCE, f"prompt {i}: logprob off by {error:.3f}"
        top2 = reference.topk(2).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * LOGPROB_TOLERANCE
        first_choices = torch.tensor([lp.top[0][0] for lp in logprobs])
        assert torch.equal(first_choices[clear], reference.argmax(-1)[clear]), f"prompt {i}"
        assert [lp.top[0][0] for lp in logprobs[len(prompt) - 1 :]] == tokens  # greedy
        checked += int(clear.sum())
    assert checked >= 30, f"only {checked} positions clear of twice the tolerance"


def test_fp8_halves_a_block_so_twice_the_blocks_fit_a_budget(checkpoint):
    path = str(checkpoint("llama"))
    model_config = ModelConfig.from_dir(path)

    def plan(dtype: str, kv_cache_dtype: str):
        config = EngineConfig(
            model=path,
            device="cpu",
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory_gb=1 / 1024,
        )
        return plan_execution(config, model_config)

    # 2 layers x (keys, values) x 16 tokens x 2 kv heads x 16 dims, one byte each
    assert plan("bfloat16", "fp8").kv_block_bytes == 2 * 2 * 16 * 2 * 16
    assert plan("bfloat16", "fp8").kv_block_bytes * 2 == plan("bfloat16", "auto").kv_block_bytes
    assert plan("bfloat16", "fp8").num_kv_blocks == 2 * plan("bfloat16", "auto").num_kv_blocks
    assert plan("float32", "fp8_e4m3").num_kv_blocks == 4 * plan("float32", "auto").num_kv_blocks
    assert plan("bfloat16", "fp8_e4m3").kv_cache_dtype == FP8
    assert plan("bfloat16", "auto").kv_cache_dtype == torch.bfloat16


def test_the_plan_line_and_cache_config_info_say_fp8(checkpoint, caplog):
    path = str(checkpoint("llama"))
    config = EngineConfig(
        model=path,
        device="cpu",
        dtype="bfloat16",
        kv_cache_dtype="fp8",
        kv_cache_memory_gb=1 / 1024,
        attention_backend="torch",
        max_model_len=100,
    )
    with caplog.at_level("INFO"):
        engine = LLMEngine(config)
    blocks = 2**20 // (2 * 2 * 16 * 2 * 16)
    plan_lines = [r.getMessage() for r in caplog.records if "KV blocks" in r.getMessage()]
    assert plan_lines == [
        f"execution plan: {path} (llama): device cpu, dtype bfloat16, attention torch, "
        "cuda graphs off, cpu graphs off, packed linears on, max_model_len 100, "
        f"kv fp8, {blocks} KV blocks x 16 tokens"
    ]
    assert engine.runner.kv_caches[0][0].shape == (blocks, 16, 2, 16)
    labels = cache_config_labels(engine)
    assert labels["cache_dtype"] == "fp8"
    assert labels["num_gpu_blocks"] == str(blocks)


def test_two_ranks_give_one_ranks_tokens_with_fp8_kv(checkpoint):
    path = str(checkpoint("qwen2"))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    settings = dict(dtype="float32", num_kv_blocks=48, kv_cache_dtype="fp8")
    tokens = {}
    for size in (1, 2):
        llm = LLM(path, tensor_parallel_size=size, **settings)
        try:
            assert llm.engine.plan.kv_cache_dtype == FP8
            outputs = llm.generate(prompts(), params)
            tokens[size] = [out.outputs[0].token_ids for out in outputs]
        finally:
            llm.engine.shutdown()
    assert tokens[2] == tokens[1]


CHECKPOINT_SCALES = {  # layer: (k_scale, v_scale), as two exporters name them
    0: KVScales(0.0625, 0.03125),  # compressed-tensors: self_attn.k_scale, shape []
    1: KVScales(0.375, 0.1875),  # ModelOpt: self_attn.k_proj.k_scale, shape [1]
}


def test_checkpoint_scales_are_the_ones_the_cache_is_written_with(checkpoint, tmp_path):
    source = checkpoint("llama")
    path = tmp_path / "scaled"
    shutil.copytree(source, path)
    weights = load_file(path / "model.safetensors")
    weights["model.layers.0.self_attn.k_scale"] = torch.tensor(CHECKPOINT_SCALES[0].k)
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(CHECKPOINT_SCALES[0].v)
    weights["model.layers.1.self_attn.k_proj.k_scale"] = torch.tensor([CHECKPOINT_SCALES[1].k])
    weights["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor([CHECKPOINT_SCALES[1].v])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    engine = LLMEngine(
        EngineConfig(model=str(path), dtype="float32", kv_cache_dtype="fp8", num_kv_blocks=16)
    )
    layers = engine.runner.model.layers
    assert [layer.self_attn.kv_scales for layer in layers] == [
        CHECKPOINT_SCALES[0],
        CHECKPOINT_SCALES[1],
    ]
    backend = layers[0].self_attn.backend
    stores = []
    store_kv = backend.store_kv

    def recording_store(key, value, key_cache, value_cache, slots, kv_scales):
        stores.append((key.clone(), value.clone(), key_cache, value_cache, slots.clone()))
        store_kv(key, value, key_cache, value_cache, slots, kv_scales)

    backend.store_kv = recording_store
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.add_request("0", prompts()[1], params)
    while engine.has_unfinished_requests():
        engine.step()
    assert len(stores) == len(layers)  # one prefill step
    for layer, (key, value, key_cache, value_cache, slots) in enumerate(stores):
        assert key_cache is engine.runner.kv_caches[layer][0]
        scales = CHECKPOINT_SCALES[layer]
        as_bytes = key_cache.view(torch.uint8).flatten(0, 1)[slots]
        assert torch.equal(as_bytes, quantize(key, scales.k).view(torch.uint8))
        assert not torch.equal(as_bytes, quantize(key, 1.0).view(torch.uint8))
        as_bytes = value_cache.view(torch.uint8).flatten(0, 1)[slots]
        assert torch.equal(as_bytes, quantize(value, scales.v).view(torch.uint8))


def test_a_scale_that_is_not_one_positive_number_is_refused(checkpoint, tmp_path):
    path = tmp_path / "bad"
    shutil.copytree(checkpoint("llama"), path)
    weights = load_file(path / "model.safetensors")
    weights["model.layers.0.self_attn.v_scale"] = torch.tensor(0.0)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="a v_scale must be one positive number"):
        LLMEngine(EngineConfig(model=str(path), kv_cache_dtype="fp8", num_kv_blocks=8))


@pytest.mark.parametrize(("capability", "refused"), [((8, 0), True), ((8, 9), False)])
def test_the_triton_kernels_need_a_gpu_with_e4m3(checkpoint, monkeypatch, capability, refused):
    """Compute capability 8.9 (Ada) and later convert to e4m3; an A100 (8.0) is refused
    when the plan is made, not when a kernel first compiles."""
    path = str(checkpoint("llama"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    config = EngineConfig(model=path, device="cuda", kv_cache_dtype="fp8", num_kv_blocks=8)
    if refused:
        with pytest.raises(ValueError, match=r"compute capability 8\.9 or newer"):
            plan_execution(config, ModelConfig.from_dir(path))
    else:
        assert plan_execution(config, ModelConfig.from_dir(path)).kv_cache_dtype == FP8
