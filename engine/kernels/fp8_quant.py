"""Activations to FP8 (e4m3fn) for the FP8 GEMMs, in torch (CPU tensors and CUDA alike).

A scale is a dequantization scale, float32: ``x ≈ xq.float() * scale``. Quantizing divides
by it in float32, clamps to ``±FP8_MAX`` (a cast to e4m3fn does not saturate: past 448 it
gives NaN) and casts, which rounds to nearest, ties to even. Dynamic scales are the largest
magnitude of what they cover over ``FP8_MAX``, that magnitude floored at ``MIN_AMAX`` so an
all-zero row gets a finite, nonzero scale (and quantizes to zeros).
"""

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_AMAX = 1e-12


def _to_fp8(scaled: torch.Tensor) -> torch.Tensor:
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static: ``x / scale`` to FP8 with one float32 ``scale`` (a 0-d or one-element tensor)
    for the whole tensor."""
    return _to_fp8(x.float() / scale.float().reshape(()))


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic, one scale per row of ``x`` ``[M, K]``: ``(xq [M, K], scale float32 [M, 1])``."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    return _to_fp8(xf / scale), scale


def quantize_per_token_group(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic, one scale per row of ``x`` ``[M, K]`` per ``group`` consecutive columns (the
    last group holds the ``K % group`` left over when ``group`` does not divide ``K``):
    ``(xq [M, K], scale float32 [M, ceil(K / group)])``."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.nn.functional.pad(x.float(), (0, groups * group - k)).view(m, groups, group)
    scale = padded.abs().amax(dim=2, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    xq = _to_fp8(padded / scale).view(m, groups * group)[:, :k].contiguous()
    return xq, scale.view(m, groups)
