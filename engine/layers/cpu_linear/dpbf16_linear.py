"""bfloat16 linear layers on CPUs with AVX-512-BF16 dot products but no AMX (AMD from Zen 4
on) through the project's own kernel (``csrc/cpu_dpbf16.c``), over the weight packed once in
AMX's pair layout (``amx_linear.PairLinear``), which is also the dot product's.

oneDNN's bf16 path (``PackedLinear``) loses rate at decode batch sizes: on a 2-core Zen 5,
in the engine, a 16-stream bf16 decode step of the 134M benchmark model ran 15 % faster on
this kernel, and W1's linears 0.2-0.8 s faster; alone it is 13 % faster at 64 rows and level
with oneDNN at one row and at prefill sizes (benchmarks/cpu-levers.md, lever 14). It keeps
every sum in registers over the whole reduction and streams the weight once per block of
rows, its tiles fetching the next columns as they read the current ones, as the float32
kernel (``panel_linear``) does. It is taken for every bf16 linear whose shape it takes
(``amx_linear.takes``) where ``can_use`` and AMX is not: oneDNN's packed weight is opaque,
so serving both kernels would keep two copies of every weight. The sums run in k order in
float32 and are rounded to bf16 once, as oneDNN's are; results may differ from oneDNN's in
the sums' rounding only.
"""

import functools

import torch

from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.cpu_linear.amx_linear import PairLinear


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
