"""Tiny Qwen3-Next and Qwen3.5 checkpoints built by transformers: Gated DeltaNet layers
around a gated full-attention one (the last layer linear, so that its rows are cut after
the DeltaNet), RoPE on a quarter of each head, RMSNorm weights drawn away from
transformers' zero init (so the ``1 + weight`` scaling counts), and states small enough
that the test prompts (up to 200 tokens) cross the delta rule's 64-token chunks."""

from pathlib import Path

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


def build_qwen3_next(path: Path, seed: int = 0, **overrides) -> Path:
    """Experts in layers 0 and 2, a dense MLP in layer 1 (``mlp_only_layers``)."""
    build_checkpoint(
        "qwen3_next", path, seed, **{**HYBRID, **MOE, "mlp_only_layers": [1], **overrides}
    )
    draw_norms(path, seed)
    return path
