"""The CPU kernels' SIMD paths as pytest parameters (those this CPU cannot run are
skipped), torch's thread count set for a while, and the float64 linear the linear kernels
are checked against."""

import contextlib
from collections.abc import Iterator

import pytest
import torch

from kvserve.engine.kernels import cpu_library

ISA_PARAMS = [
    pytest.param(
        isa,
        id=isa,
        marks=pytest.mark.skipif(
            isa not in cpu_library.supported_isas(), reason=f"this CPU has no {isa}"
        ),
    )
    for isa in cpu_library.ISAS
]


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads (and so the kernels' OpenMP threads) set to ``n``."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def float64_linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """``layer(x)`` computed in float64 from the same values."""
    bias = None if layer.bias is None else layer.bias.double()
    return torch.nn.functional.linear(x.double(), layer.weight.double(), bias)
