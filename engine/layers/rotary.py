"""Rotary position embeddings (default and llama3-scaled), as a cos/sin table."""

import math
from typing import TYPE_CHECKING

import torch

from kvserve.engine.layers import fused_ops

if TYPE_CHECKING:
    from kvserve.engine.models.model_config import RopeConfig


def inverse_frequencies(rope: "RopeConfig", head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Rotates query and key heads by position (half-split layout, as in Llama)."""

    def __init__(self, rope: "RopeConfig", head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build(self, dtype: torch.dtype, device: torch.device) -> None:
        """Fill the table in fp32, then store it in the activations' dtype."""
        positions = torch.arange(self.max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inverse_frequencies(self.rope, self.head_dim)[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        self.cos_sin = torch.stack([angles.cos(), angles.sin()]).to(device=device, dtype=dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q`` and ``k`` rotated; on a CPU in place (see ``fused_ops.rope``)."""
        return fused_ops.rope(positions, q, k, self.cos_sin)
