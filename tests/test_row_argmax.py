"""The sampler's row argmax (csrc/cpu_argmax.c) gives torch.argmax's indices exactly: ties
to the first, NaN above any number, infinities, rows shorter than a vector and strided
rows, on each SIMD path this CPU has and on several threads."""

import pytest
import torch
from cpu_paths import ISA_PARAMS, num_threads

from kvserve.engine.kernels.row_argmax import row_argmax


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    with num_threads(request.param):
        yield request.param


def _rows(cols: int) -> torch.Tensor:
    """Random rows, then rows with a tied largest value in the first vector, in two lanes
    of one later vector, between a vector and the tail, and in the tail; rows with NaNs,
    infinities and -inf masks."""
    torch.manual_seed(cols)
    x = torch.randn(12, cols)
    last = cols - 1
    x[1, [0, cols // 2, last]] = 9.0
    x[2, [min(17, last), min(18, last)]] = 9.0
    x[3, [min(3, last), last]] = 9.0
    x[4, :] = 1.5  # every element ties
    x[5, :] = -torch.inf
    x[6, [cols // 3, last]] = torch.inf
    x[7, [cols // 2, last]] = torch.nan
    x[8, last] = torch.nan
    x[9, :] = -torch.inf
    x[9, last] = -3.0
    x[10, :: max(cols // 7, 1)] = -torch.inf
    x[11, [0, last]] = torch.nan
    return x


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("cols", [1, 3, 15, 16, 17, 33, 1000, 32_003])
def test_row_argmax_is_torchs(isa, cols, threads):
    x = _rows(cols)
    got = row_argmax(x, isa=isa)
    assert got.dtype == torch.int64
    assert got.tolist() == x.argmax(dim=-1).tolist()


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_strided_rows_and_the_fallbacks(isa):
    wide = _rows(1000)
    x = wide[:, 5:205]  # rows 1,000 elements apart
    assert row_argmax(x, isa=isa).tolist() == x.argmax(dim=-1).tolist()
    half = wide.bfloat16()
    assert row_argmax(half, isa=isa).tolist() == half.argmax(dim=-1).tolist()
    columns = wide.t()  # not unit-stride within a row: torch's argmax
    assert row_argmax(columns, isa=isa).tolist() == columns.argmax(dim=-1).tolist()
