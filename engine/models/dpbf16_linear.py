"""bfloat16 linear layers on CPUs with AVX-512-BF16 dot products but no AMX (AMD from Zen 4
on) through the project's own kernel (``csrc/cpu_dpbf16.c``), over the weight packed once in
AMX's pair layout (``amx_linear.PairLinear``), which is also the dot product's.

oneDNN's bf16 path (``PackedLinear``) streams a decode step's weights well below the
machine's read rate: on the 134M benchmark model's shapes, on a 2-core Zen 5, 30 GB/s at one
row and 25 GB/s at 16 rows where a plain read gets ~43 (benchmarks/cpu-levers.md, lever 14).
This kernel keeps every sum in registers over the whole reduction and streams the weight
once per block of rows, its tiles fetching the next columns as they read the current ones,
as the float32 kernel (``panel_linear``) does. It is taken for every bf16 linear whose shape
it takes (``amx_linear.takes``) where ``can_use`` and AMX is not: oneDNN's packed weight is
opaque, so serving both kernels would keep two copies of every weight. The sums run in k
order in float32 and are rounded to bf16 once, as oneDNN's are; results may differ from
oneDNN's in the sums' rounding only.
"""

import functools

import torch

from kvserve.engine import cpu_library
from kvserve.engine.models.amx_linear import PairLinear


@functools.cache
def _usable() -> bool:
    lib = cpu_library.load()
    return lib is not None and lib.dpbf16_usable() == 1


def can_use(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether bf16 linears can run this kernel here: a CPU with AVX-512 (F, BW, VL) and
    AVX-512-BF16, and the library built."""
    return device.type == "cpu" and dtype == torch.bfloat16 and _usable()


class DpBf16Linear(PairLinear):
    """``PairLinear`` on AVX-512-BF16 dot products."""

    kernel = "linear_bf16_dp"
    isa = "avx512_bf16"
