"""RMSNorm, with the residual stream's add fused into it (``fused_ops.rms_norm``)."""

import torch
from torch import nn

from kvserve.engine.layers import fused_ops


class RMSNorm(nn.Module):
    """Replicated: every rank holds the whole weight (its loader is the default one)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised ``x``; with ``residual``, first ``residual += x`` in place and the
        normalised sum (the residual stream's add fused into the norm)."""
        return fused_ops.rms_norm(x, self.weight, self.eps, residual)
