"""Linear layers on a CPU with their weights prepacked once: for oneDNN, or for float32 on
an AVX2 CPU into the panels of the project's own kernel (``panel_linear``).

torch's plain matmul re-lays a bf16 weight out on every call, and its float32 matmul
goes to MKL, which on AMD CPUs takes a narrower code path; oneDNN keeps the weight in its
blocked layout and dispatches on the CPU it runs on (AMX, AVX-512, AVX-512-BF16, AVX2).
Measured on the 134M benchmark model's shapes (benchmarks/cpu-levers.md): bf16 is
bit-identical to torch's and 1.1-2x faster at decode batch sizes; float32 is 2.2x faster
on an AVX-512 EPYC and differs from MKL's in rounding only (accumulation order, ~1e-6).
"""

import torch
from torch import nn

from kvserve.engine.models import panel_linear

BATCH_HINT = 64  # the row count oneDNN tunes the packed layout for; any count works


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``pack_linears`` packs a model's linears in ``dtype`` on ``device``."""
    if panel_linear.can_use(dtype, device):
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

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.register_buffer(
            "packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        )
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> None:
    """Replace every ``nn.Linear`` of ``model`` by a ``PanelLinear`` (where
    ``panel_linear.can_use``) or a ``PackedLinear``, in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if panel_linear.can_use(child.weight.dtype, child.weight.device):
                setattr(module, name, panel_linear.PanelLinear(child))
            else:
                setattr(module, name, PackedLinear(child))
