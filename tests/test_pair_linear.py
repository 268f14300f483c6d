"""The bfloat16 linear kernels over AMX's pair layout (``amx_linear.PairLinear``): AMX tiles
(csrc/cpu_amx.c) and AVX-512-BF16 dot products (csrc/cpu_dpbf16.c), each against a float64
linear of the same bf16 values on the CPUs that run it (skipped elsewhere): row counts
around their register tiles (16 and 8 rows), items and blocks (32 and 128 rows), column
blocks around their pairs and 3-block groups, biases, strided inputs, several threads; the
layout they share (on any CPU); and where pack_linears takes each."""

import pytest
import torch
from cpu_paths import float64_linear, num_threads
from torch import nn

from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.cpu_linear import amx_linear, dpbf16_linear
from kvserve.engine.layers.cpu_linear.packed_linear import PackedLinear, pack_linears

CPU = torch.device("cpu")
AMX = amx_linear.can_use(torch.bfloat16, CPU)
DPBF16 = dpbf16_linear.can_use(torch.bfloat16, CPU)
needs_dpbf16 = pytest.mark.skipif(not DPBF16, reason="this CPU has no AVX-512-BF16")
KERNELS = [
    pytest.param(
        amx_linear.AmxLinear,
        id="amx",
        marks=pytest.mark.skipif(not AMX, reason="this CPU has no AMX-BF16"),
    ),
    pytest.param(dpbf16_linear.DpBf16Linear, id="avx512_bf16", marks=needs_dpbf16),
]

SHAPES = [  # (rows, out, in)
    pytest.param(1, 16, 32, id="one-row-one-block"),
    pytest.param(7, 48, 64, id="odd-column-blocks"),
    pytest.param(8, 80, 64, id="a-group-and-two-blocks"),
    pytest.param(9, 32, 32, id="rows-past-a-dp-tile"),
    pytest.param(16, 64, 96, id="one-amx-row-tile"),
    pytest.param(17, 32, 32, id="rows-past-an-amx-tile"),
    pytest.param(33, 80, 64, id="rows-past-an-amx-item"),
    pytest.param(130, 112, 64, id="rows-past-a-dp-block-and-a-lone-column-block"),
    pytest.param(400, 48, 32, id="dp-blocks-shared-by-threads"),  # 3 threads: 6 of 64-72 rows
    # runs of pairs or groups taken (take_size) that do not divide a chunk or block
    pytest.param(300, 784, 64, id="takes-across-chunks-and-blocks"),
    # 19 groups of 3 column blocks in one block of rows: the last taken in shorter runs
    pytest.param(64, 912, 64, id="last-groups-in-shorter-runs"),
    pytest.param(64, 768, 768, id="decode-sized"),
    pytest.param(200, 2304, 768, id="prefill-sized"),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("rows", "out", "inputs"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "3-threads"])
def test_pair_kernel_matches_float64(kernel, rows, out, inputs, bias, threads):
    torch.manual_seed(rows * out + inputs)
    layer = nn.Linear(inputs, out, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, inputs).to(torch.bfloat16)
    with num_threads(threads), torch.inference_mode():
        got = kernel(layer)(x)
    assert (got.dtype, got.shape) == (torch.bfloat16, (rows, out))
    # float32 sums rounded to bf16 once: within one bf16 step of the exact value
    torch.testing.assert_close(got.double(), float64_linear(x, layer), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_pair_kernel_takes_strided_and_batched_inputs(kernel):
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=True).to(torch.bfloat16)
    wide = torch.randn(2, 5, 96).to(torch.bfloat16)
    x = wide[..., 16:80]  # rows 96 elements apart
    with torch.inference_mode():
        got = kernel(layer)(x)
    assert got.shape == (2, 5, 32)
    torch.testing.assert_close(got.double(), float64_linear(x, layer), rtol=2**-7, atol=1e-3)


@needs_dpbf16
def test_dpbf16_kernel_refuses_shapes_it_does_not_take():
    x, panels, out = (torch.zeros(64, dtype=torch.bfloat16) for _ in range(3))

    def linear(n: int, k: int) -> None:
        cpu_library.run(
            "linear_bf16_dp",
            x=x.data_ptr(),
            panels=panels.data_ptr(),
            bias=None,
            out=out.data_ptr(),
            m=1,
            n=n,
            k=k,
            x_stride=k,
            num_threads=1,
        )

    refused = r"^linear_bf16_dp failed \(-1\)$"
    with pytest.raises(RuntimeError, match=refused):
        linear(n=24, k=2)  # out features not a multiple of 16
    with pytest.raises(RuntimeError, match=refused):
        linear(n=16, k=3)  # an odd number of in features
    linear(n=16, k=2)


def test_pair_linear_packs_column_pairs_of_16_column_blocks():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    w = layer.weight
    panels = dpbf16_linear.DpBf16Linear(layer).panels
    assert panels.shape == (2, 2, 16, 16, 2)
    # row i of a tile is column pair i: w[j][2i], w[j][2i + 1] for each of the 16 rows j
    assert torch.equal(panels[0, 0, 3, 5], w[5, 6:8])
    # a block is one k pair after another: pair 20 of rows 16.. is in the second 32-wide step
    assert torch.equal(panels[1].reshape(32, 16, 2)[20, 5], w[21, 40:42])
    assert torch.equal(amx_linear.AmxLinear(layer).panels, panels)


@pytest.mark.skipif(not (AMX or DPBF16), reason="this CPU has neither AMX nor AVX-512-BF16")
def test_pack_linears_takes_amx_else_the_dot_product_kernel_for_the_shapes_they_take():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 16), nn.Linear(64, 8)).to(torch.bfloat16)
    pack_linears(model)
    first = amx_linear.AmxLinear if AMX else dpbf16_linear.DpBf16Linear
    # in features a multiple of 32 and out features of 16, else oneDNN
    assert [type(m) for m in model] == [first, PackedLinear, PackedLinear]
    assert not amx_linear.can_use(torch.float32, CPU)
    assert not dpbf16_linear.can_use(torch.float32, CPU)
