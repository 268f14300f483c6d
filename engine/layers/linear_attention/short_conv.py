"""The causal depthwise convolution (with SiLU) over a Gated DeltaNet's q, k and v
channels, its state in slots."""

from typing import Any

import torch
from torch import nn

from kvserve.engine.kernels import causal_conv1d_torch, triton_causal_conv1d
from kvserve.engine.layers.linear import read, set_weight_loader
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.tensor_parallel import TensorParallel


class ShortConvolution(nn.Module):
    """``weight`` ``[conv_dim / tp, kernel]``: this rank's channels of the checkpoint's
    ``conv1d.weight`` ``[conv_dim, 1, kernel]``, whose ``sections`` (q, k, v: sizes over all
    ranks) are each split evenly over the ranks and kept in order."""

    def __init__(self, sections: list[int], kernel: int, tp: TensorParallel, kernels: str) -> None:
        super().__init__()
        self.sections, self.tp, self.kernels = sections, tp, kernels
        self.weight = nn.Parameter(
            torch.empty(sum(sections) // tp.size, kernel), requires_grad=False
        )
        set_weight_loader(self.weight, self._load)

    def forward(
        self, x: torch.Tensor, conv_state: torch.Tensor, meta: StateMetadata
    ) -> torch.Tensor:
        """``x`` ``[T, conv_dim / tp]`` (rows any stride apart) → same shape."""
        slots, has_state, w = meta.state_slots, meta.has_initial_state, self.weight
        ops = triton_causal_conv1d if self.kernels == "triton" else causal_conv1d_torch
        if meta.decode_only:
            return ops.causal_conv1d_step(x, w, conv_state, slots, has_state)
        if self.kernels == "triton":
            cu = meta.query_start_loc
            return triton_causal_conv1d.causal_conv1d(x, w, cu, conv_state, slots, has_state)
        cu_host = meta.query_start_loc_host
        return causal_conv1d_torch.causal_conv1d(x, w, cu_host, conv_state, slots, has_state)

    def _load(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        start = offset = 0
        with torch.no_grad():
            for size in self.sections:
                rows = size // self.tp.size
                part = read(loaded, 0, offset + self.tp.rank * rows, rows)
                param[start : start + rows].copy_(part.reshape(rows, -1))
                start, offset = start + rows, offset + size
