"""The gated RMSNorm of a Gated DeltaNet's output: ``weight * rmsnorm(x) * silu(z)`` per
head (Qwen3-Next's and Qwen3.5's ``RMSNormGated``)."""

import torch
import torch.nn.functional as F
from torch import nn


class GatedRMSNorm(nn.Module):
    """Over the last dimension (one value head): the norm in float32, rounded to ``x``'s
    dtype before the weight, the gate's SiLU in float32. Replicated: every rank holds the
    whole ``[head_dim]`` weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(z.float())).to(x.dtype)
