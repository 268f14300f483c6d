"""Tiny Gemma 3 text checkpoints built by transformers: two sliding-window layers of an
8-token window around a global one (the test prompts cross the window many times), linear
RoPE scaling on the global layer and its own base on the local ones, a
``query_pre_attn_scalar`` that is not the head size, and RMSNorm weights drawn away from
transformers' zero init (so the ``1 + weight`` scaling counts)."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
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


def build_gemma3(path: Path, seed: int = 0, **overrides) -> Path:
    build_checkpoint("gemma3_text", path, seed, **{**GEMMA3, **overrides})
    draw_norms(path, seed)
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


def draw_norms(path: Path, seed: int) -> None:
    """Every ``*norm.weight`` of the checkpoint at ``path`` redrawn from N(0, 0.3²)."""
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if name.endswith("norm.weight"):
            weights[name] = torch.randn(tensor.shape, generator=generator) * 0.3
    save_file(weights, path / "model.safetensors", {"format": "pt"})
