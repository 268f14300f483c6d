"""A global ``sliding_window`` (Mistral: every layer; Qwen2 with ``use_sliding_window``: the
layers from ``max_window_layers`` on) is each such layer's window, as in transformers: the
tokens match transformers' past the window, under chunked prefill with preemption and
prefix caching, and the window caps no context."""

import pytest
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from checkpoints import build_checkpoint
from reference import assert_greedy_match, hf_greedy

WINDOW = 8
# (config overrides, the KV groups, KV blocks: few enough to preempt)
MODELS = {
    "mistral": (dict(sliding_window=WINDOW), [("sliding_attention", WINDOW, (0, 1))], 12),
    "qwen2": (
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        [("full_attention", None, (0,)), ("sliding_attention", WINDOW, (1,))],
        40,
    ),
}
SETTINGS = dict(block_size=4, max_num_batched_tokens=13, enable_prefix_caching=True)


@pytest.mark.parametrize("family", MODELS)
@pytest.mark.usefixtures("scheduling")
def test_windowed_layers_match_transformers_and_cap_no_context(family, tmp_path):
    overrides, groups, num_kv_blocks = MODELS[family]
    path = str(build_checkpoint(family, tmp_path, seed=3, **overrides))
    config = EngineConfig(model=path, dtype="float32", num_kv_blocks=num_kv_blocks, **SETTINGS)
    engine = LLMEngine(config)
    assert [(g.kind, g.window, g.layers) for g in engine.kv.groups] == groups
    assert engine.plan.max_model_len == 512  # the checkpoint's context, not the window
    prompts = make_prompts(seed=49, shared_prefixes=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every group after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)
    assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
