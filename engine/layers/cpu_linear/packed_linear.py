"""Linear layers on a CPU with their weights prepacked once: for oneDNN, or into the
layouts of the project's own kernels: float32 on an AVX2 or AVX-512 CPU (``panel_linear``),
bfloat16 on a CPU with AMX (``amx_linear``) or else with AVX-512-BF16 (``dpbf16_linear``).

torch's plain matmul re-lays a bf16 weight out on every call, and its float32 matmul
goes to MKL, which on AMD CPUs takes a narrower code path; oneDNN keeps the weight in its
blocked layout and dispatches on the CPU it runs on (AMX, AVX-512, AVX-512-BF16, AVX2).
Measured on the 134M benchmark model's shapes (benchmarks/cpu-levers.md): bf16 is
bit-identical to torch's and 1.1-2x faster at decode batch sizes; float32 is 2.2x faster
on an AVX-512 EPYC and differs from MKL's in rounding only (accumulation order, ~1e-6).
"""

import torch
from torch import nn

from kvserve.engine.layers.cpu_linear import amx_linear, dpbf16_linear, panel_linear
from kvserve.engine.layers.cpu_linear.kernel_linear import Weights

BATCH_HINT = 64  # the row count oneDNN tunes the packed layout for; any count works


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``pack_linears`` packs a model's linears in ``dtype`` on ``device``."""
    if any(m.can_use(dtype, device) for m in (panel_linear, amx_linear, dpbf16_linear)):
        return True
    mkldnn = torch.ops.mkldnn
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_linear_pointwise")
        and (dtype == torch.float32 or bool(mkldnn._is_mkldnn_bf16_supported()))
    )


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward over a weight prepacked for oneDNN."""

    def __init__(self, linear: Weights) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.register_buffer(
            "packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        )
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> None:
    """Replace every ``nn.Linear`` of ``model`` in place by an ``AmxLinear`` (where
    ``amx_linear.can_use`` and it takes the shape), else a ``DpBf16Linear`` (where
    ``dpbf16_linear.can_use`` and it takes the shape), a ``PanelLinear`` (where
    ``panel_linear.can_use``) or a ``PackedLinear``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, packed(child))


def packed(linear: Weights) -> nn.Module:
    """``linear`` with its weight packed for the kernel that runs it here."""
    dtype, device = linear.weight.dtype, linear.weight.device
    if amx_linear.can_use(dtype, device) and amx_linear.takes(linear):
        return amx_linear.AmxLinear(linear)
    if dpbf16_linear.can_use(dtype, device) and amx_linear.takes(linear):
        return dpbf16_linear.DpBf16Linear(linear)
    if panel_linear.can_use(dtype, device):
        return panel_linear.PanelLinear(linear)
    return PackedLinear(linear)
