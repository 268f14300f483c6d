"""Gemma 4 (text) gives transformers' greedy tokens in float32, with prompts that cross its
8-token sliding window, under the default settings and under chunked prefill (chunks that
split a window) with preemption and prefix caching, the audit of every KV group after every
step, with per-layer input embeddings too; a config turning on a feature not served is
refused, naming its field."""

import json
import random

import pytest
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig, RopeConfig

from gemma_checkpoints import (
    EXPERTS,
    GLOBAL_HEAD,
    KEYS_AS_VALUES,
    KV_SHARED,
    PER_LAYER_INPUTS,
    WINDOW,
    build_gemma4,
    build_gemma4_any_to_text,
)
from reference import assert_greedy_match, hf_greedy

CHUNKED = dict(block_size=4, max_num_batched_tokens=13, enable_prefix_caching=True)
SCENARIOS = {
    "default-settings": dict(),
    "chunked-prefill-preemption-prefix-cache": CHUNKED | {"num_kv_blocks": 48},
}


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    return build_gemma4(tmp_path_factory.mktemp("gemma4"), final_logit_softcapping=15.0)


def greedy_matches(path, settings: dict, prompts: list[list[int]]) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", **settings))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every group after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(str(path), prompt, hf_greedy(str(path), prompt, MAX_TOKENS), got)
    return engine


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_matches_transformers(gemma4, scenario):
    prompts = make_prompts(seed=52, shared_prefixes=scenario != "default-settings")
    assert max(map(len, prompts)) > 4 * WINDOW
    engine = greedy_matches(gemma4, SCENARIOS[scenario], prompts)
    assert [(g.kind, g.window, g.layers) for g in engine.kv.groups] == [
        ("full_attention", None, (2,)),
        ("sliding_attention", WINDOW, (0,)),
        ("sliding_attention", WINDOW, (1,)),
    ]
    if scenario != "default-settings":
        assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0


@pytest.fixture(scope="module")
def gemma4_ple(tmp_path_factory):
    return build_gemma4(tmp_path_factory.mktemp("gemma4-ple"), seed=3, **PER_LAYER_INPUTS)


def test_per_layer_input_embeddings_match_transformers(gemma4_ple):
    cfg = ModelConfig.from_dir(gemma4_ple)
    assert cfg.gemma is not None
    assert (cfg.gemma.per_layer_input_size, cfg.gemma.per_layer_vocab_size) == (8, 512)
    for scenario, settings in SCENARIOS.items():
        prompts = make_prompts(seed=55, shared_prefixes=scenario != "default-settings")
        greedy_matches(gemma4_ple, settings, prompts)


@pytest.fixture(scope="module")
def gemma4_kv_shared(tmp_path_factory):
    # with per-layer inputs, as the checkpoints that share KV have them (transformers' KV
    # sharing also slices them, and fails without)
    path = tmp_path_factory.mktemp("gemma4-kv-shared")
    return build_gemma4(path, seed=4, **KV_SHARED, **PER_LAYER_INPUTS)


def test_kv_shared_layers_and_keys_as_values_match_transformers(gemma4_kv_shared):
    """Layers 3 and 4 keep no blocks (three groups of the three owning kinds' layers) and
    project queries only; the global layers project no values."""
    cfg = ModelConfig.from_dir(gemma4_kv_shared)
    assert (cfg.kv_owners, cfg.kv_shared_layers) == ((0, 1, 2, 1, 2), (3, 4))
    assert cfg.gemma is not None and (cfg.gemma.k_eq_v, cfg.gemma.double_wide_mlp) == (True, True)
    for scenario, settings in SCENARIOS.items():
        prompts = make_prompts(seed=56, shared_prefixes=scenario != "default-settings")
        engine = greedy_matches(gemma4_kv_shared, settings, prompts)
        assert [(g.kind, g.window, g.layers) for g in engine.kv.groups] == [
            ("full_attention", None, (2,)),
            ("sliding_attention", WINDOW, (0,)),
            ("sliding_attention", WINDOW, (1,)),
        ]
        if scenario != "default-settings":
            assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    model = engine.runner.model
    parts = [layer.self_attn.qkv_proj.parts for layer in model.layers]
    assert parts == ["qkv", "qkv", "qk", "q", "q"]
    widths = [layer.mlp.down_proj.in_features for layer in model.layers]
    assert widths == [128, 128, 128, 256, 256]
    runner = engine.runner
    assert runner.kv_caches[3] is runner.kv_caches[1] and runner.kv_caches[4] is runner.kv_caches[2]


@pytest.mark.parametrize("fields", ["global-head", "keys-as-values"])
def test_global_layers_of_another_head_shape_share_pages_of_equal_bytes(tmp_path, fields):
    """global_head_dim 32 (sliding: 16): the global layer's 64 elements a token fill a page
    as both sliding layers' do, so they are one group; with one global kv head its layers
    have a sliding layer's 32 elements in another shape. Each layer's cache is its slice of
    the pages, and the tokens are transformers'."""
    extra = {"global-head": GLOBAL_HEAD, "keys-as-values": KEYS_AS_VALUES | PER_LAYER_INPUTS}
    path = build_gemma4(tmp_path / fields, seed=5, **extra[fields])
    cfg = ModelConfig.from_dir(path)
    global_shape = (2, 32) if fields == "global-head" else (1, 32)
    layers = cfg.num_layers
    types = (WINDOW, WINDOW, None, WINDOW, None)[:layers]
    assert cfg.layer_kv_shapes == tuple(global_shape if w is None else (2, 16) for w in types)
    for scenario, settings in SCENARIOS.items():
        prompts = make_prompts(seed=57, shared_prefixes=scenario != "default-settings")
        engine = greedy_matches(path, settings, prompts)
        if scenario != "default-settings":
            assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    groups = [(g.kind, g.layers, g.token_elements) for g in engine.kv.groups]
    if fields == "global-head":
        assert groups == [("full_attention", (2,), 64), ("sliding_attention", (0, 1), 32)]
    else:
        assert groups == [
            ("full_attention", (2,), 32),
            ("sliding_attention", (0,), 32),
            ("sliding_attention", (1,), 32),
        ]
    keys = [key for key, _ in engine.runner.kv_caches]
    assert keys[2].shape[1:] == (4, *global_shape) and keys[0].shape[1:] == (4, 2, 16)
    assert keys[0].data_ptr() == keys[2].data_ptr()  # the first slice of the same pages
    # a sliding layer's cache steps over the other's slice from block to block
    assert keys[1].is_contiguous() == (fields == "keys-as-values")


def test_experts_beside_the_dense_mlp_match_transformers(tmp_path):
    """enable_moe_block: each layer routes its stream to 2 of 4 GeGLU experts (router and
    per-expert scales drawn away from 1) beside its dense MLP."""
    path = build_gemma4(tmp_path / "moe", seed=6, **EXPERTS)
    cfg = ModelConfig.from_dir(path)
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.top_k) == (4, 2)
    for scenario, settings in SCENARIOS.items():
        prompts = make_prompts(seed=58, shared_prefixes=scenario != "default-settings")
        engine = greedy_matches(path, settings, prompts)
    layer = engine.runner.model.layers[0]
    assert (layer.experts.activation, layer.experts.layout) == ("gelu_tanh", "gate_up")


def test_prompts_of_1_to_200_tokens_match_transformers_in_chunks_that_split_windows(gemma4):
    rng = random.Random(53)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 2, 9, 77, 200)]
    greedy_matches(gemma4, CHUNKED | {"num_kv_blocks": 160}, prompts)


def test_a_checkpoint_of_several_modalities_serves_its_language_model(tmp_path):
    path = build_gemma4_any_to_text(tmp_path / "any-to-text", seed=1)
    cfg = ModelConfig.from_dir(path)
    assert (cfg.architecture, cfg.family, cfg.num_layers, cfg.tie_word_embeddings) == (
        "Gemma4ForConditionalGeneration",
        "gemma4",
        3,
        False,
    )
    prompts = make_prompts(seed=54, shared_prefixes=True)
    greedy_matches(path, SCENARIOS["chunked-prefill-preemption-prefix-cache"], prompts)


def test_the_config_reads_gemma4s_layers_and_ropes(gemma4):
    cfg = ModelConfig.from_dir(gemma4)
    assert (cfg.architecture, cfg.family, cfg.layer_windows) == (
        "Gemma4ForCausalLM",
        "gemma4",
        (WINDOW, WINDOW, None),
    )
    assert cfg.rope == RopeConfig(theta=1e6, rope_type="proportional", partial_rotary_factor=0.5)
    assert cfg.gemma is not None and cfg.gemma.local_rope_theta == 10_000.0
    assert (cfg.gemma.query_pre_attn_scalar, cfg.gemma.final_logit_softcapping) == (1.0, 15.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(use_bidirectional_attention="all"),
            r"^use_bidirectional_attention='all' is not supported \(Gemma 4 bidirectional "
            r"attention; 'vision', for image tokens only, is served for text\)$",
        ),
        (
            dict(num_kv_shared_layers=3),
            r"^num_kv_shared_layers=3 leaves no earlier layer of each type of the 3 layers to "
            r"share keys and values from$",
        ),
    ],
)
def test_a_feature_not_served_is_refused_naming_its_field(gemma4, fields, message):
    raw = json.loads((gemma4 / "config.json").read_text())
    ModelConfig.from_dict(raw)  # served as it is
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**raw, **fields})


def test_a_config_without_layer_types_gets_transformers_pattern_last_layer_full():
    raw = dict(
        architectures=["Gemma4ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=16, hidden_size_per_layer_input=0, sliding_window=WINDOW,
    )  # fmt: skip
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_windows == (WINDOW,) * 5 + (None, None)
    assert cfg.rope == RopeConfig(theta=1e6, rope_type="proportional", partial_rotary_factor=0.25)
