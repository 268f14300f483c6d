"""The forward shared by the linear layers whose product is one call of a C kernel of the
project's library (``cpu_library``): ``panel_linear`` (float32), ``amx_linear`` and
``dpbf16_linear`` (bf16).
Each kernel takes x, panels (the packed weight), bias (float32, or NULL), out, m (rows), n
(out features), k (in features), x_stride (x's row stride) and num_threads, then its own
arguments (``kernel_args``)."""

from typing import Protocol

import torch
from torch import nn

from kvserve.engine.kernels import cpu_library


class Weights(Protocol):
    """What the packed layers read of a linear layer: ``nn.Linear``, or one of
    ``engine/layers/linear.py`` (this rank's shard)."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def bias(self) -> torch.Tensor | None: ...


class KernelLinear(nn.Module):
    """``nn.Linear``'s forward over ``x``'s rows (any leading shape, rows strided or not) into
    a new ``out_dtype`` tensor through the library's function ``kernel``, over ``panels`` (the
    weight as that kernel packs it) and ``kernel_bias`` (float32, or None)."""

    panels: torch.Tensor
    kernel_bias: torch.Tensor | None
    in_features: int
    out_features: int
    out_dtype: torch.dtype
    kernel: str

    def kernel_args(self) -> dict[str, int]:
        """The kernel's own arguments, by name."""
        return {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=self.out_dtype)
        cpu_library.run(
            self.kernel,
            x=rows.data_ptr(),
            panels=self.panels.data_ptr(),
            bias=None if self.kernel_bias is None else self.kernel_bias.data_ptr(),
            out=out.data_ptr(),
            m=rows.shape[0],
            n=self.out_features,
            k=self.in_features,
            x_stride=rows.stride(0),
            num_threads=torch.get_num_threads(),
            **self.kernel_args(),
        )
        return out.view(*x.shape[:-1], self.out_features)
