"""Rotary position embeddings as a cos/sin table: default, linear, llama3, yarn, longrope
and proportional frequencies, computed as transformers' rope init functions compute them."""

import math
from typing import TYPE_CHECKING

import torch

from kvserve.engine.layers import fused_ops

if TYPE_CHECKING:
    from kvserve.engine.models.model_config import RopeConfig


def inverse_frequencies(rope: "RopeConfig", head_dim: int, long: bool = False) -> torch.Tensor:
    """One frequency per rotated pair, ``[head_dim // 2]``; ``long``: longrope's long
    factors instead of its short ones."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "proportional":
        rotated = int(rope.partial_rotary_factor * head_dim // 2)
        return torch.cat([inv_freq[:rotated], torch.zeros(head_dim // 2 - rotated)]) / rope.factor
    if rope.rope_type == "llama3":
        return _llama3(rope, inv_freq)
    if rope.rope_type == "yarn":
        return _yarn(rope, inv_freq, head_dim)
    if rope.rope_type == "longrope":
        factors = rope.long_factor if long else rope.short_factor
        if len(factors) != head_dim // 2:
            name = "long_factor" if long else "short_factor"
            raise ValueError(
                f"rope_parameters.{name} has {len(factors)} values; head_dim {head_dim} "
                f"needs {head_dim // 2}"
            )
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * rope.theta**exponents)
    return inv_freq


def attention_factor(rope: "RopeConfig") -> float:
    """The scale on cos and sin: the config's ``attention_factor``, else yarn's
    ``0.1 * mscale * ln(factor) + 1`` (a ratio of two when ``mscale_all_dim`` is set)
    and longrope's ``sqrt(1 + ln(factor) / ln(original_max))``; 1 for the rest."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.rope_type == "yarn":
        if rope.mscale and rope.mscale_all_dim:
            return _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(
                rope.factor, rope.mscale_all_dim
            )
        return _yarn_mscale(rope.factor, 1.0)
    if rope.rope_type == "longrope" and rope.factor > 1.0:
        return math.sqrt(
            1 + math.log(rope.factor) / math.log(rope.original_max_position_embeddings)
        )
    return 1.0


def _llama3(rope: "RopeConfig", inv_freq: torch.Tensor) -> torch.Tensor:
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


def _yarn(rope: "RopeConfig", inv_freq: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Interpolated (divided by ``factor``) below ``beta_slow`` rotations over the
    original context, extrapolated (kept) above ``beta_fast``, a linear ramp between."""

    def pair_index(rotations: float) -> float:
        old_len = rope.original_max_position_embeddings
        return (head_dim * math.log(old_len / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low, high = pair_index(rope.beta_fast), pair_index(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    interpolated = 1.0 / (rope.factor * (1.0 / inv_freq))
    return interpolated * ramp + inv_freq * (1 - ramp)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class RotaryEmbedding(torch.nn.Module):
    """Rotates query and key heads by position (half-split layout, as in Llama).

    longrope: a position at or past ``original_max_position_embeddings`` turns by the long
    factors, an earlier one by the short, so a key once cached never needs turning again
    (transformers switches every position of a sequence once it grows past that length).

    With a ``partial_rotary_factor`` below 1 (but for proportional RoPE, whose frequencies
    span the head), only each head's first ``rotary_dim`` dimensions turn (as a head of that
    size would); the rest pass unchanged."""

    def __init__(self, rope: "RopeConfig", head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        proportional = rope.rope_type == "proportional"  # its frequencies span the head
        self.rotary_dim = head_dim if proportional else int(head_dim * rope.partial_rotary_factor)
        self.max_positions = max_positions
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build(self, dtype: torch.dtype, device: torch.device) -> None:
        """Fill the table in fp32, then store it in the activations' dtype."""
        positions = torch.arange(self.max_positions, dtype=torch.float32)[:, None]
        freqs = positions * inverse_frequencies(self.rope, self.rotary_dim)[None, :]
        if self.rope.rope_type == "longrope":
            long = positions * inverse_frequencies(self.rope, self.rotary_dim, long=True)[None, :]
            past = positions >= self.rope.original_max_position_embeddings
            freqs = torch.where(past, long, freqs)
        angles = torch.cat([freqs, freqs], dim=-1)
        table = torch.stack([angles.cos(), angles.sin()]) * attention_factor(self.rope)
        self.cos_sin = table.to(device=device, dtype=dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q`` and ``k`` rotated; on a CPU in place (see ``fused_ops.rope``)."""
        if self.rotary_dim == self.head_dim:
            return fused_ops.rope(positions, q, k, self.cos_sin)
        dim = self.rotary_dim
        q_rot, k_rot = fused_ops.rope(
            positions, q[..., :dim].contiguous(), k[..., :dim].contiguous(), self.cos_sin
        )
        return torch.cat([q_rot, q[..., dim:]], -1), torch.cat([k_rot, k[..., dim:]], -1)

    def query(self, positions: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``q`` alone rotated (a layer reading another layer's keys), as ``forward`` does."""
        return self(positions, q, q[:, :1].clone())[0]
