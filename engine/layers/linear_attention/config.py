"""The shape of a Gated DeltaNet layer, read once from a Hugging Face text config."""

from dataclasses import dataclass
from typing import Any

import torch

from kvserve.engine.layers.linear_attention.metadata import StateSpec


@dataclass(frozen=True)
class GatedDeltaNetConfig:
    """``layout``: which checkpoint layout the input projections have (``qwen3_next``:
    fused ``in_proj_qkvz`` / ``in_proj_ba`` grouped by key head; ``qwen3_5``: separate
    ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``)."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float
    layout: str

    def __post_init__(self) -> None:
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"{self.num_v_heads} value heads cannot share {self.num_k_heads} key heads evenly"
            )
        if self.layout not in ("qwen3_next", "qwen3_5"):
            raise ValueError(f"unknown Gated DeltaNet layout {self.layout!r}")

    @property
    def group(self) -> int:
        """Value heads per key head."""
        return self.num_v_heads // self.num_k_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v of every head."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def state_spec(self, tp_size: int, dtype: torch.dtype) -> StateSpec:
        """One layer's state per sequence on each of ``tp_size`` ranks, in a model of ``dtype``
        (the heads split by key head)."""
        return StateSpec(
            conv_shape=(self.conv_dim // tp_size, self.conv_kernel - 1),
            ssm_shape=(self.num_v_heads // tp_size, self.head_k_dim, self.head_v_dim),
            conv_dtype=dtype,
        )

    @classmethod
    def from_hf(cls, config: Any, layout: str) -> "GatedDeltaNetConfig":
        """From a ``Qwen3NextConfig`` or a ``Qwen3_5TextConfig`` (or any object with their
        ``linear_*`` fields)."""
        return cls(
            hidden_size=config.hidden_size,
            num_k_heads=config.linear_num_key_heads,
            num_v_heads=config.linear_num_value_heads,
            head_k_dim=config.linear_key_head_dim,
            head_v_dim=config.linear_value_head_dim,
            conv_kernel=config.linear_conv_kernel_dim,
            eps=config.rms_norm_eps,
            layout=layout,
        )
