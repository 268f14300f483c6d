"""Tiny Qwen3-Next and Qwen3.5 checkpoints built by transformers: Gated DeltaNet layers
around a gated full-attention one (the last layer linear, so that its rows are cut after
the DeltaNet), RoPE on a quarter of each head, RMSNorm weights drawn away from
transformers' zero init (so the ``1 + weight`` scaling counts), and states small enough
that the test prompts (up to 200 tokens) cross the delta rule's 64-token chunks. Qwen3.5's
also as image-text checkpoints (``...ForConditionalGeneration``), as they are published."""

import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from checkpoints import build_checkpoint
from gemma_checkpoints import draw_norms

LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention"]
HYBRID = dict(
    num_hidden_layers=3,
    layer_types=LAYER_TYPES,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    max_position_embeddings=1024,
)
MOE = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
VISION = dict(
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
    patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
)  # fmt: skip
IMAGE_TEXT = {
    "qwen3_5_text": (Qwen3_5Config, Qwen3_5ForConditionalGeneration),
    "qwen3_5_moe_text": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration),
}


def build_qwen3_next(path: Path, seed: int = 0, **overrides) -> Path:
    """Experts in layers 0 and 2, a dense MLP in layer 1 (``mlp_only_layers``)."""
    build_checkpoint(
        "qwen3_next", path, seed, **{**HYBRID, **MOE, "mlp_only_layers": [1], **overrides}
    )
    draw_norms(path, seed, around=0.0)
    return path


def build_qwen3_5(path: Path, family: str, seed: int = 0) -> Path:
    """A text-only ``Qwen3_5ForCausalLM`` (``qwen3_5_text``) or ``Qwen3_5MoeForCausalLM``
    (``qwen3_5_moe_text``: experts in every layer; its config.json names no dense
    ``intermediate_size``, as the published ones do not) checkpoint."""
    build_checkpoint(family, path, seed, **HYBRID, **(MOE if "moe" in family else {}))
    draw_norms(path, seed, around=0.0)
    if "moe" in family:
        config = json.loads((path / "config.json").read_text())
        del config["intermediate_size"]
        (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def build_qwen3_5_image_text(path: Path, family: str, seed: int = 0) -> Path:
    """``build_qwen3_5``'s language model next to a one-block vision tower, as transformers
    saves a ``Qwen3_5(Moe)ForConditionalGeneration``."""
    text_path = build_qwen3_5(path.with_name(f"{path.name}.text"), family, seed)
    config_class, model_class = IMAGE_TEXT[family]
    text = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    config = config_class(
        text_config=text.config.to_dict(), vision_config=VISION, tie_word_embeddings=False
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(text_path).save_pretrained(path)
    return path
