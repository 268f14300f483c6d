"""Gemma 3 (text) gives transformers' greedy tokens in float32, with prompts that cross its
8-token sliding window, under the default settings and under chunked prefill (chunks that
split a window) with preemption and prefix caching, the audit of every KV group after every
step; its sliding layers' blocks leave the cache while a request runs; the window caps no
context."""

import random

import pytest
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig

from audit import assert_all_released, audit_blocks
from gemma_checkpoints import WINDOW, build_gemma3, build_gemma3_image_text
from reference import assert_greedy_match, hf_greedy

SCENARIOS = {
    "default-settings": dict(),
    "chunked-prefill-preemption-prefix-cache": dict(
        block_size=4, num_kv_blocks=48, max_num_batched_tokens=13, enable_prefix_caching=True
    ),
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return build_gemma3(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def gemma3_softcapped(tmp_path_factory):
    return build_gemma3(
        tmp_path_factory.mktemp("gemma3-softcap"),
        seed=1,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=15.0,
    )


@pytest.fixture(scope="module")
def gemma3_image_text(tmp_path_factory):
    return build_gemma3_image_text(tmp_path_factory.mktemp("gemma3-it") / "image-text")


def greedy_matches(path, scenario: str, seed: int) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", **SCENARIOS[scenario]))
    prompts = make_prompts(seed=seed, shared_prefixes=scenario != "default-settings")
    assert max(map(len, prompts)) > 4 * WINDOW
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every group after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(str(path), prompt, hf_greedy(str(path), prompt, MAX_TOKENS), got)
    return engine


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_matches_transformers(gemma3, scenario):
    engine = greedy_matches(gemma3, scenario, seed=46)
    assert [(g.kind, g.window, g.layers) for g in engine.kv.groups] == [
        ("full_attention", None, (1,)),
        ("sliding_attention", WINDOW, (0,)),
        ("sliding_attention", WINDOW, (2,)),
    ]
    if scenario != "default-settings":
        assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0


def test_final_soft_capping_matches_transformers_and_attention_capping_is_ignored_as_there(
    gemma3_softcapped,
):
    greedy_matches(gemma3_softcapped, "default-settings", seed=47)


def test_a_long_request_holds_a_flat_window_of_sliding_blocks(gemma3):
    engine = LLMEngine(EngineConfig(model=str(gemma3), dtype="float32", block_size=4))
    prompt = make_prompts(seed=48, shared_prefixes=False)[0][:3]
    max_tokens = 200
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request("long", prompt, params)
    held = []  # (full group's blocks, each sliding group's blocks) after every step
    while engine.has_unfinished_requests():
        engine.step()
        audit_blocks(engine)
        for request in engine.scheduler.running:
            tables = zip(request.block_tables, request.num_skipped_blocks, strict=True)
            held.append([len(table) - skipped for table, skipped in tables])
    assert_all_released(engine)
    past_window = held[WINDOW + 4 :]
    assert {h[1] for h in past_window} <= {2, 3} and {h[2] for h in past_window} <= {2, 3}
    assert past_window[-1][0] == (len(prompt) + max_tokens - 1 + 3) // 4  # full: everything


def test_the_window_caps_no_context(gemma3):
    cfg = ModelConfig.from_dir(gemma3)
    assert (cfg.layer_windows, cfg.sliding_window) == ((WINDOW, None, WINDOW), None)
    engine = LLMEngine(EngineConfig(model=str(gemma3), dtype="float32", max_num_seqs=2))
    assert engine.plan.max_model_len == 4096
    assert "shared by 3 groups of 1 layers (1 full_attention, 2 sliding_attention 8)" in str(
        engine.plan
    )


def test_an_image_text_checkpoint_serves_its_language_model(gemma3_image_text):
    cfg = ModelConfig.from_dir(gemma3_image_text)
    assert (cfg.architecture, cfg.family, cfg.num_layers) == (
        "Gemma3ForConditionalGeneration",
        "gemma3",
        3,
    )
    greedy_matches(gemma3_image_text, "chunked-prefill-preemption-prefix-cache", seed=50)


def test_prompts_of_1_to_200_tokens_match_transformers_in_chunks_that_split_windows(gemma3):
    settings = SCENARIOS["chunked-prefill-preemption-prefix-cache"] | {"num_kv_blocks": 160}
    engine = LLMEngine(EngineConfig(model=str(gemma3), dtype="float32", **settings))
    rng = random.Random(51)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 2, 9, 77, 200)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every group after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(str(gemma3), prompt, hf_greedy(str(gemma3), prompt, MAX_TOKENS), got)
