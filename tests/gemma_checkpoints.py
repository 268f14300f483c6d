"""Tiny Gemma 3 and Gemma 4 text checkpoints built by transformers: two sliding-window layers
of an 8-token window and a global one (the test prompts cross the window many times), the
global layer's RoPE scaled (Gemma 3: linear; Gemma 4: proportional, half its pairs rotating)
and the local ones' of their own base; Gemma 3's ``query_pre_attn_scalar`` is not the head
size; RMSNorm weights (and Gemma 4's ``layer_scalar``) are drawn away from transformers' init
(so the ``1 + weight`` scaling, or its absence, counts)."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4VisionConfig,
    SiglipVisionConfig,
)

from checkpoints import build_checkpoint

WINDOW = 8
GEMMA3 = dict(
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    sliding_window=WINDOW,
    head_dim=16,
    query_pre_attn_scalar=24,
    max_position_embeddings=4096,
    rope_parameters={
        "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1_000_000.0),
        "sliding_attention": dict(rope_type="default", rope_theta=10_000.0),
    },
)


GEMMA4 = dict(
    num_hidden_layers=3,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=WINDOW,
    head_dim=16,
    global_head_dim=16,
    hidden_size_per_layer_input=0,
    rope_parameters={
        "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.5, rope_theta=1e6),
        "sliding_attention": dict(rope_type="default", rope_theta=10_000.0),
    },
)

KV_SHARED = dict(
    num_hidden_layers=5,
    layer_types=[
        "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
        "full_attention",
    ],
    num_kv_shared_layers=2,
    attention_k_eq_v=True,
    num_global_key_value_heads=2,
    use_double_wide_mlp=True,
)  # fmt: skip
"""Gemma 4's layer sharing: layers 3 (sliding) and 4 (global) read the keys and values of
layers 1 and 2 and have twice as wide MLPs; the global layers' values are their keys."""

GLOBAL_HEAD = dict(global_head_dim=32)
"""A global layer of twice the sliding layers' head size: a page holds both sliding layers
or the global one (64 elements a token)."""

KEYS_AS_VALUES = dict(KV_SHARED, global_head_dim=32, num_global_key_value_heads=1)
"""KV sharing with global layers of one kv head of 32: as many elements as a sliding layer
(2 x 16), in another shape."""

EXPERTS = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=48)
"""Gemma 4's MoE variant: 4 GeGLU experts, 2 a token, beside each layer's dense MLP."""

PER_LAYER_INPUTS = dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=512)
"""Gemma 4's per-layer input embeddings, 8 wide, a table row for every token."""


def build_gemma3(path: Path, seed: int = 0, **overrides) -> Path:
    build_checkpoint("gemma3_text", path, seed, **{**GEMMA3, **overrides})
    draw_norms(path, seed, around=0.0)
    return path


def build_gemma4(path: Path, seed: int = 0, **overrides) -> Path:
    build_checkpoint("gemma4_text", path, seed, **{**GEMMA4, **overrides})
    draw_norms(path, seed, around=1.0)
    return path


def build_gemma3_image_text(path: Path, seed: int = 0) -> Path:
    """A ``Gemma3ForConditionalGeneration`` checkpoint: ``build_gemma3``'s language model
    next to a one-layer SigLIP vision tower and its projector, as transformers saves it."""
    text_path = build_gemma3(path.with_name(f"{path.name}.text"), seed)
    text = Gemma3TextConfig.from_pretrained(text_path)
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=8,
    )  # fmt: skip
    config = Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
        image_token_index=5, boi_token_index=6, eoi_token_index=7,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    language = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    model.model.language_model.load_state_dict(language.model.state_dict())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(text_path).save_pretrained(path)
    return path


def build_gemma4_any_to_text(path: Path, seed: int = 0) -> Path:
    """A ``Gemma4ForConditionalGeneration`` checkpoint: ``build_gemma4``'s language model next
    to a one-layer vision tower and its projector (no audio tower), as transformers saves it."""
    text_path = build_gemma4(path.with_name(f"{path.name}.text"), seed)
    text = Gemma4TextConfig.from_pretrained(text_path)
    vision = Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    # the media tokens' ids past the vocabulary: text alone never holds one
    media = ("image_token_id", "boi_token_id", "eoi_token_id", "video_token_id", "boa_token_id",
             "eoa_token_index", "audio_token_id")  # fmt: skip
    config = Gemma4Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), tie_word_embeddings=False,
        **{name: text.vocab_size + i for i, name in enumerate(media)},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config).eval()
    language = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    model.model.language_model.load_state_dict(language.model.state_dict())
    model.lm_head.load_state_dict(language.lm_head.state_dict())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(text_path).save_pretrained(path)
    return path


def draw_norms(path: Path, seed: int, around: float) -> None:
    """Each norm weight, layer scalar and Gemma 4 router scale: ``around`` (its init) plus
    noise of scale 0.3."""
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
            weights[name] = around + torch.randn(tensor.shape, generator=generator) * 0.3
    save_file(weights, path / "model.safetensors", {"format": "pt"})
