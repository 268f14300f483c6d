"""The bfloat16 AMX linear kernel (csrc/cpu_amx.c, through AmxLinear) against a float64
linear of the same bf16 values, on CPUs with AMX (skipped elsewhere): row counts around
the 16-row tiles and the 32-row items, an odd number of 16-column blocks, biases, strided
inputs, several threads; and where pack_linears takes it."""

import pytest
import torch
from cpu_paths import num_threads
from torch import nn

from kvserve.engine.models import amx_linear
from kvserve.engine.models.packed_linear import PackedLinear, pack_linears

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not amx_linear.can_use(torch.bfloat16, CPU), reason="this CPU has no AMX-BF16"
)

SHAPES = [  # (rows, out, in)
    pytest.param(1, 16, 32, id="one-row-one-tile"),
    pytest.param(7, 48, 64, id="odd-column-blocks"),
    pytest.param(16, 64, 96, id="one-row-tile"),
    pytest.param(17, 32, 32, id="rows-past-a-tile"),
    pytest.param(33, 80, 64, id="rows-past-an-item"),
    pytest.param(64, 768, 768, id="decode-sized"),
    pytest.param(100, 2304, 768, id="prefill-sized"),
]


def reference(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.double()
    return nn.functional.linear(x.double(), layer.weight.double(), bias)


@pytest.mark.parametrize(("rows", "out", "inputs"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "3-threads"])
def test_amx_linear_matches_float64(rows, out, inputs, bias, threads):
    torch.manual_seed(rows * out + inputs)
    layer = nn.Linear(inputs, out, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, inputs).to(torch.bfloat16)
    with num_threads(threads), torch.inference_mode():
        got = amx_linear.AmxLinear(layer)(x)
    assert (got.dtype, got.shape) == (torch.bfloat16, (rows, out))
    # float32 sums rounded to bf16 once: within one bf16 step of the exact value
    torch.testing.assert_close(got.double(), reference(x, layer), rtol=2**-7, atol=1e-3)


def test_amx_linear_takes_strided_and_batched_inputs():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=True).to(torch.bfloat16)
    wide = torch.randn(2, 5, 96).to(torch.bfloat16)
    x = wide[..., 16:80]  # rows 96 elements apart
    with torch.inference_mode():
        got = amx_linear.AmxLinear(layer)(x)
    assert got.shape == (2, 5, 32)
    torch.testing.assert_close(got.double(), reference(x, layer), rtol=2**-7, atol=1e-3)


def test_pack_linears_takes_amx_for_the_shapes_it_takes():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 16), nn.Linear(64, 8)).to(torch.bfloat16)
    pack_linears(model)
    # in features a multiple of 32 and out features of 16, else oneDNN
    assert [type(m) for m in model] == [amx_linear.AmxLinear, PackedLinear, PackedLinear]
    assert not amx_linear.can_use(torch.float32, CPU)
