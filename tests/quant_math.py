"""Round-to-nearest quantizers for the test checkpoints: 4-bit integer groups and FP8 blocks.

Every scale is rounded *up* to 4 significant bits (``coarse_scale``). A 4-bit integer or an
e4m3 value has at most 4 significant bits too, so each dequantized weight (value times scale)
has at most 8 and is exact in bfloat16, float16 and float32 alike: a reader that dequantizes in
any of them gets the same numbers, and those numbers are the reference checkpoint's weights.
"""

from dataclasses import dataclass

import torch

SCALE_BITS = 4
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
INT4_MAX = 15


def coarse_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` (positive, float32) rounded up to ``SCALE_BITS`` significant bits."""
    mantissa, exponent = torch.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    steps = torch.ceil(mantissa * 2**SCALE_BITS)
    return torch.ldexp(steps, exponent - SCALE_BITS)


@dataclass(frozen=True)
class Int4Groups:
    """A weight [N, K] (out, in) as unsigned 4-bit values in groups of input columns.

    Column k belongs to group ``g_idx[k]``; each (row, group) has one scale and one zero point,
    and the weight it means is ``(q - zero[:, g_idx]) * scale[:, g_idx]``. Symmetric groups
    have zero point 8, so their values are the signed ``q - 8`` in [-8, 7].
    """

    q: torch.Tensor  # [N, K] int64 in [0, 15]
    scale: torch.Tensor  # [N, groups] float32
    zero: torch.Tensor  # [N, groups] int64 in [0, 15]
    g_idx: torch.Tensor  # [K] int64

    def dequantized(self) -> torch.Tensor:
        return (self.q - self.zero[:, self.g_idx]).float() * self.scale[:, self.g_idx]


def quantize_int4(
    weight: torch.Tensor, g_idx: torch.Tensor, *, symmetric: bool, min_zero: int = 0
) -> Int4Groups:
    """Min-max 4-bit quantization of ``weight`` [N, K] over the column groups ``g_idx``
    (every group the same size). Symmetric: scale = absmax / 7.5 and zero point 8 (GPTQ's and
    compressed-tensors' rule); asymmetric: scale = (max - min) / 15 with 0 inside [min, max],
    zero point round(-min / scale) clamped to [``min_zero``, 15]."""
    rows = weight.shape[0]
    groups = int(g_idx.max()) + 1
    grouped = weight[:, torch.argsort(g_idx, stable=True)].reshape(rows, groups, -1)
    low = grouped.amin(-1).clamp(max=0)
    high = grouped.amax(-1).clamp(min=0)
    if symmetric:
        scale = coarse_scale(torch.maximum(-low, high).clamp(min=1e-6) / 7.5)
        zero = torch.full_like(scale, 8, dtype=torch.int64)
    else:
        scale = coarse_scale((high - low).clamp(min=1e-6) / INT4_MAX)
        zero = torch.round(-low / scale).long().clamp(min_zero, INT4_MAX)
    q = torch.round(weight / scale[:, g_idx]).long() + zero[:, g_idx]
    return Int4Groups(q.clamp(0, INT4_MAX), scale, zero, g_idx)


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] as float8_e4m3fn with one float32 scale per ``block`` of rows and
    columns (edge blocks may be partial): ``(N, K)`` per tensor, ``(1, K)`` per output channel,
    ``(128, 128)`` DeepSeek-V3's blocks. Returns (values [N, K], scales [ceil(N/bn), ceil(K/bk)]),
    the weight meant being ``values * scales`` expanded over the blocks."""
    rows, cols = weight.shape
    block_rows, block_cols = block
    padded = torch.nn.functional.pad(weight.abs(), (0, -cols % block_cols, 0, -rows % block_rows))
    amax = padded.unflatten(0, (-1, block_rows)).unflatten(2, (-1, block_cols)).amax((1, 3))
    scale = coarse_scale(amax.clamp(min=1e-6) / FP8_MAX)
    values = (weight / expand_blocks(scale, block, weight.shape)).to(torch.float8_e4m3fn)
    return values, scale


def expand_blocks(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Block scales [ceil(N/bn), ceil(K/bk)] spread over every element of an [N, K] weight."""
    spread = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return spread[: shape[0], : shape[1]]
