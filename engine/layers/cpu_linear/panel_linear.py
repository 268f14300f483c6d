"""Float32 linear layers on a CPU through the project's own kernel (``csrc/cpu_linear.c``),
over a weight packed once into panels of the SIMD path's width; and bfloat16 ones on CPUs
without bf16 arithmetic, through the same kernel over bf16 panels (widened to float32 in
the kernel, summed in float32, rounded once), where torch's bf16 matmul is emulated element
by element.

The kernel keeps every sum in registers over the whole reduction and fetches the next panel
while it reads the current one. The engine takes it for float32 on CPUs whose widest path is
AVX2 or AVX-512 (PANEL_ISAS). On AVX2, oneDNN's float32 kernels lose up to a third of the
rate at decode batch sizes: measured alternating in one process on the 134M benchmark model
with torch, oneDNN and these kernels held to AVX2 (benchmarks/cpu-levers.md, lever 7), a
16-stream decode 1.19-1.23x, W1 1.08-1.22x. On AVX-512 (Zen 5, lever 12) the kernel alone is
1.04x oneDNN at 64 rows, 1.17x at 16 and level at 2048, and W1's decode-step linears took
0.12-0.64 s less (of ~4.9) in every one of four alternating runs. Sums run in k order:
results differ from oneDNN's and MKL's in rounding.
"""

import ctypes

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.kernels import cpu_isa, cpu_library
from kvserve.engine.layers.cpu_linear.kernel_linear import KernelLinear, Weights


def tile_shape(isa: str) -> tuple[int, int]:
    """(rows, panel width) of a register tile on the SIMD path ``isa``; needs the library."""
    lib = cpu_library.load()
    assert lib is not None
    rows = ctypes.c_int()
    width = lib.linear_tile_shape(cpu_library.ISAS[isa], ctypes.byref(rows))
    if width < 0:
        raise RuntimeError(f"the CPU kernels have no {isa} path here")
    return rows.value, width


PANEL_ISAS = ("avx2", "avx512")
"""The widest SIMD paths on which the engine packs linears for this kernel."""

KERNELS = {torch.float32: "linear_f32", torch.bfloat16: "linear_bf16"}


def can_use(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the engine packs linears in ``dtype`` for this kernel here: float32, or
    bfloat16 on a CPU without native bf16, where the widest path is one of PANEL_ISAS."""
    return (
        device.type == "cpu"
        and (
            dtype == torch.float32
            or (dtype == torch.bfloat16 and not cpu_isa.native_bf16(cpu_isa.cpu_flags()))
        )
        and cpu_library.available()
        and cpu_library.default_isa() in PANEL_ISAS
    )


class PanelLinear(KernelLinear):
    """``nn.Linear``'s forward for float32 or bfloat16 (the weight's dtype) on a CPU.
    ``panels``: [ceil(out / W), in, W] in that dtype, the weight's rows W at a time,
    transposed (W: the panel width of ``isa``), zeros past the last row; ``kernel_bias``:
    the bias in float32 with zeros to a whole panel (or None)."""

    isa: str

    def __init__(self, linear: Weights, isa: str | None = None) -> None:
        super().__init__()
        self.isa = isa or cpu_library.default_isa()
        self.out_dtype = linear.weight.dtype
        self.kernel = KERNELS[self.out_dtype]
        self.out_features, self.in_features = linear.weight.shape
        width = tile_shape(self.isa)[1]
        padded = cdiv(self.out_features, width) * width
        weight = torch.zeros(padded, self.in_features, dtype=self.out_dtype)
        weight[: self.out_features] = linear.weight.detach()
        panels = weight.view(padded // width, width, self.in_features).transpose(1, 2)
        self.register_buffer("panels", panels.contiguous())
        self.kernel_bias = None
        if linear.bias is not None:
            self.kernel_bias = torch.zeros(padded, dtype=torch.float32)
            self.kernel_bias[: self.out_features] = linear.bias.detach()

    def kernel_args(self) -> dict[str, int]:
        return {"isa": cpu_library.ISAS[self.isa]}
