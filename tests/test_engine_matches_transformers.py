"""Greedy output equals transformers' generate, token for token, whatever the batch,
chunking, preemption or prefix caching; and every block comes back."""

import random

import pytest
from cpu_paths import num_threads
from joined_outputs import JoinedOutputs

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.cpu_linear import panel_linear
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models import decoder

from audit import assert_all_released, audit_blocks
from checkpoints import FAMILIES, build_checkpoint
from reference import assert_greedy_match, hf_greedy

pytestmark = pytest.mark.usefixtures("scheduling", "speculation")
MAX_TOKENS = 24
SCENARIOS = {
    "whole-prompts": dict(num_kv_blocks=512, max_num_batched_tokens=2048),
    "chunked-prefill": dict(num_kv_blocks=512, max_num_batched_tokens=16),
    "preemption": dict(num_kv_blocks=40, max_num_batched_tokens=64),
    "prefix-cache": dict(num_kv_blocks=512, max_num_batched_tokens=48, enable_prefix_caching=True),
    "prefix-cache-preemption": dict(
        num_kv_blocks=40, max_num_batched_tokens=64, enable_prefix_caching=True
    ),
    "torch-attention-preemption": dict(
        num_kv_blocks=40, max_num_batched_tokens=64, attention_backend="torch"
    ),
}


def make_prompts(seed: int, shared_prefixes: bool) -> list[list[int]]:
    """18 prompts of 5..60 tokens; with shared prefixes, groups of three start alike."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 512) for _ in range(rng.randrange(8, 30))] for _ in range(6)]
    prompts = []
    for i in range(18):
        body = [rng.randrange(3, 512) for _ in range(rng.randrange(5, 31))]
        prompts.append(prefixes[i // 3] + body if shared_prefixes else body + body[: i * 2])
    return prompts


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    results: dict[str, list[int]] = {}
    seen = JoinedOutputs()
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            if out.finished:
                assert out.outputs[0].finish_reason == "length"
                results[out.request_id] = out.outputs[0].token_ids
        audit_blocks(engine)
    assert_all_released(engine)
    return [results[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers(checkpoint, family, scenario):
    path = str(checkpoint(family))
    settings = dict(block_size=4, max_num_seqs=32, enable_prefix_caching=False)
    settings.update(SCENARIOS[scenario])
    engine = LLMEngine(EngineConfig(model=path, dtype="float32", **settings))
    prompts = make_prompts(seed=len(family), shared_prefixes=scenario.startswith("prefix"))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)
    stats = engine.stats
    if "preemption" in scenario:
        assert stats.num_preemptions > 0
    if "prefix" in scenario:
        assert stats.prefix_cache_hits > 0
    else:
        assert stats.prefix_cache_hits == 0


def test_greedy_matches_transformers_with_the_cpu_mlp_in_row_chunks(checkpoint, monkeypatch):
    """The MLP's chunk budget shrunk to 7 rows: whole-prompt steps of 18 prompts go through
    it in chunks cut mid-prompt and mid-batch, as few as the budget allows and as equal as
    ``split`` cuts them, and the tokens are still transformers'."""
    path = str(checkpoint("llama"))
    engine = LLMEngine(
        EngineConfig(model=path, dtype="float32", block_size=4, enable_prefix_caching=False)
    )
    width = engine.runner.model.layers[0].mlp.gate_up_width
    monkeypatch.setattr(decoder, "CPU_MLP_CHUNK_BYTES", 7 * width * 4)
    calls: list[tuple[int, list[int]]] = []  # (rows in, rows of each chunk)
    rows, forward = decoder.MLP._rows, decoder.MLP.forward
    monkeypatch.setattr(
        decoder.MLP, "_rows", lambda mlp, x: calls[-1][1].append(len(x)) or rows(mlp, x)
    )
    monkeypatch.setattr(
        decoder.MLP, "forward", lambda mlp, x: calls.append((len(x), [])) or forward(mlp, x)
    )
    prompts = make_prompts(seed=3, shared_prefixes=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)
    for n, chunks in calls:
        size = -(-n // -(-n // 7))
        assert chunks == [size] * (n // size) + ([n % size] if n % size else []), (n, chunks)
    assert max(n for n, _ in calls) > 14


@pytest.mark.parametrize("isa", panel_linear.PANEL_ISAS)
def test_greedy_matches_transformers_through_the_float32_panel_kernel(isa, checkpoint, monkeypatch):
    """On an AVX2 or AVX-512 CPU every float32 linear runs the project's kernel
    (panel_linear): the tokens are still transformers', through chunked prefill and batched
    decode."""
    if isa not in cpu_library.supported_isas():
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setattr(cpu_library, "default_isa", lambda: isa)
    path = str(checkpoint("qwen2"))
    engine = LLMEngine(
        EngineConfig(
            model=path, dtype="float32", block_size=4, max_num_batched_tokens=64,
            enable_prefix_caching=False,
        )
    )  # fmt: skip
    assert isinstance(
        engine.runner.model.layers[0].self_attn.qkv_proj.kernel, panel_linear.PanelLinear
    )
    assert isinstance(engine.runner.model.lm_head.kernel, panel_linear.PanelLinear)
    prompts = make_prompts(seed=5, shared_prefixes=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)


def test_greedy_matches_transformers_with_long_contexts_split_into_ranges(checkpoint):
    """Two prompts of 300-400 tokens decode together: on any thread count a context this
    long, next to so few tokens in the batch, is split into ranges of whole cache rows
    whose softmax sums are merged (csrc/cpu_decode.c); on 1 and 3 threads the tokens are
    still transformers'."""
    path = str(checkpoint("llama"))
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(300, 400))] for _ in range(2)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for threads in (1, 3):
        engine = LLMEngine(
            EngineConfig(model=path, dtype="float32", block_size=16, enable_prefix_caching=False)
        )
        with num_threads(threads):
            outputs = run(engine, prompts, params)
        for prompt, got in zip(prompts, outputs, strict=True):
            assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shapes_off_every_kernels_grid_decode_as_eager_steps_do(tmp_path, dtype):
    """Hidden size 40, two heads of 20 dims on one kv head, an MLP of 100: no width the
    kernels tile by (16, 32, 48). In float32 the tokens are transformers'; in both dtypes
    the decode steps (replayed where every op is a kernel, else eager) give the tokens of an
    engine that runs every step eagerly, through chunked prefill and batched decode. Where
    the bf16 layers fall to oneDNN (a CPU with native bf16), that was a failed step each."""
    path = str(
        build_checkpoint(
            "llama", tmp_path / "odd", hidden_size=40, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=100,
        )
    )  # fmt: skip
    settings = dict(block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    prompts = make_prompts(seed=7, shared_prefixes=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    engines = (
        LLMEngine(EngineConfig(path, dtype=dtype, enforce_eager=e, **settings))
        for e in (True, False)
    )
    eager, replayed = (run(engine, prompts, params) for engine in engines)
    assert replayed == eager
    if dtype == "float32":
        for prompt, got in zip(prompts, replayed, strict=True):
            assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)
