"""bfloat16 linear layers on a CPU with AMX tiles through the project's own kernel
(``csrc/cpu_amx.c``), over a weight packed once into AMX's pair layout.

oneDNN's AMX path (``PackedLinear``) reaches its peak on prefill-sized batches but not on
decode-sized ones: on the 134M benchmark model's shapes, on a 2-core Intel Xeon with AMX,
its whole-model pass at 64 rows streams the weights at ~9 GB/s of the machine's ~21
(benchmarks/cpu-levers.md, lever 9). This kernel keeps each item's sums in tiles over the
whole reduction and streams every weight tile once per 32 rows: 0.68-0.75x oneDNN's time
at 1-64 rows, but 1.13x at 2048 (its rows' tiles come from L2, not L1). It is taken for
every bf16 linear whose shape it takes (in features a multiple of 32, out features of 16)
where ``can_use``: oneDNN's packed weight is opaque, so serving both kernels would keep two
copies of every weight. The sums run in k order in float32 and are rounded to bf16 once,
as oneDNN's are; results may differ from oneDNN's in the sums' rounding only.
"""

import ctypes
import functools

import torch

from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.cpu_linear.kernel_linear import KernelLinear, Weights


@functools.cache
def _granted(lib: ctypes.CDLL) -> bool:
    return lib.amx_usable() == 1  # asks Linux for the tile state once per library


def _usable() -> bool:
    lib = cpu_library.load()
    return lib is not None and _granted(lib)


def can_use(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether bf16 linears can run this kernel here: a CPU with AMX-BF16 and AVX-512-BF16,
    Linux granting the process the tile state, and the library built."""
    return device.type == "cpu" and dtype == torch.bfloat16 and _usable()


def takes(linear: Weights) -> bool:
    """Whether the kernel takes this layer's shape."""
    out_features, in_features = linear.weight.shape
    return in_features % 32 == 0 and out_features % 16 == 0


class PairLinear(KernelLinear):
    """``nn.Linear``'s forward for bfloat16 through a kernel that reads AMX's pair layout
    (this one's, and ``dpbf16_linear``'s). ``panels``: [out / 16, in / 32, 16, 16, 2], the
    weight's 16-row blocks in 32-wide steps of its columns, each step's column pairs as rows
    (so a block is [in / 2, 16, 2]: one k pair of its 16 rows after another);
    ``kernel_bias``: float32, or None."""

    out_dtype = torch.bfloat16

    def __init__(self, linear: Weights) -> None:
        super().__init__()
        assert takes(linear)
        self.out_features, self.in_features = linear.weight.shape
        weight = linear.weight.detach().to(torch.bfloat16)
        blocks = weight.view(self.out_features // 16, 16, self.in_features // 32, 16, 2)
        self.register_buffer("panels", blocks.permute(0, 2, 3, 1, 4).contiguous())
        bias = linear.bias
        self.kernel_bias = None if bias is None else bias.detach().float().contiguous()


class AmxLinear(PairLinear):
    """``PairLinear`` on AMX tiles."""

    kernel = "linear_bf16_amx"
