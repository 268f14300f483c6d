"""MXFP4 expert weights as gpt-oss checkpoints store them, and their dequantization in torch.

An MXFP4 matrix ``[N, K]`` (per expert, ``N`` output rows of ``K`` input features) is two
uint8 tensors:

- ``blocks`` ``[..., N, K // 32, 16]``: 32 consecutive input features in 16 bytes, two e2m1
  codes a byte, the low nibble first (feature ``k`` is byte ``(k % 32) // 2``'s low nibble
  when ``k`` is even, its high nibble when odd). A code's value is ``E2M1_VALUES[code]``:
  0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0-7, the same negated for 8-15 (bit 3 the sign).
- ``scales`` ``[..., N, K // 32]``: one e8m0 scale per 32 features, value ``2 ** (s - 127)``.

So ``W[n, k] = E2M1_VALUES[code(n, k)] * 2 ** (scales[n, k // 32] - 127)``. The Triton MoE
kernel (``triton_fused_moe``) decodes the same layout in its inner loop; this module is the
reference that the CPU path and the tests share.
"""

from typing import NamedTuple

import torch

MXFP4_BLOCK = 32  # input features per scale
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; bit 3 is the sign
E2M1_VALUES = E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES)
E8M0_BIAS = 127


class Mxfp4Weight(NamedTuple):
    """One MXFP4 weight (module docstring): ``blocks`` uint8 ``[E, N, K // 32, 16]`` and
    ``scales`` uint8 ``[E, N, K // 32]``."""

    blocks: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(E, N, K)`` of the dense weight it stands for."""
        experts, rows, groups, _ = self.blocks.shape
        return experts, rows, groups * MXFP4_BLOCK


def check_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> None:
    """Raises ``ValueError`` naming the argument unless ``blocks`` is uint8
    ``[..., N, G, 16]`` and ``scales`` uint8 ``[..., N, G]``."""
    if blocks.dtype != torch.uint8 or blocks.dim() < 3 or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(
            f"blocks must be uint8 [..., N, K/32, 16], got {blocks.dtype} {list(blocks.shape)}"
        )
    if scales.dtype != torch.uint8 or scales.shape != blocks.shape[:-1]:
        raise ValueError(
            f"scales must be uint8 {list(blocks.shape[:-1])} (blocks' shape less its last "
            f"dimension), got {scales.dtype} {list(scales.shape)}"
        )


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``blocks`` uint8 ``[..., N, K // 32, 16]`` and ``scales`` uint8 ``[..., N, K // 32]``
    → the dense ``[..., N, K]`` in ``dtype`` (float32 holds every value exactly; bf16 does
    too unless a scale leaves its exponent range)."""
    check_mxfp4(blocks, scales)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0xF, blocks >> 4), dim=-1).flatten(-2).long()
    scale = torch.exp2(scales.float() - E8M0_BIAS)
    dense = table[codes] * scale.unsqueeze(-1)
    return dense.flatten(-2).to(dtype)
