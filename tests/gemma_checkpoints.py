"""Tiny Gemma 3 text checkpoints built by transformers: two sliding-window layers of an
8-token window around a global one (the test prompts cross the window many times), linear
RoPE scaling on the global layer and its own base on the local ones, a
``query_pre_attn_scalar`` that is not the head size, and RMSNorm weights drawn away from
transformers' zero init (so the ``1 + weight`` scaling counts)."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

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
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if name.endswith("norm.weight"):
            weights[name] = torch.randn(tensor.shape, generator=generator) * 0.3
    save_file(weights, path / "model.safetensors", {"format": "pt"})
    return path
