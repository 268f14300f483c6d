"""The panel linear kernel (csrc/cpu_linear.c, through PanelLinear) against a float64 linear
of the same values, in float32 and over bfloat16 panels, on each SIMD path this CPU has and
on several threads: row counts around the register tile and the row blocks (shared out
evenly between the threads), widths that end mid-panel, biases, strided inputs; bf16's
rounding of the float32 sums; and where pack_linears takes it."""

import pytest
import torch
from cpu_paths import ISA_PARAMS, float64_linear, num_threads
from torch import nn

from kvserve.engine.kernels import cpu_isa, cpu_library
from kvserve.engine.layers.cpu_linear import panel_linear
from kvserve.engine.layers.cpu_linear.packed_linear import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not cpu_library.available(), reason="no C compiler")

SHAPES = [  # (rows, out, in)
    pytest.param(1, 50, 37, id="one-row"),
    pytest.param(7, 48, 64, id="rows-in-one-tile"),
    pytest.param(17, 100, 96, id="rows-past-tiles"),
    pytest.param(130, 97, 33, id="rows-past-a-block"),
    # 3 threads: 6 blocks of 64-72 rows, not 4 of 128 (row_blocks, cpu_common.h)
    pytest.param(400, 60, 24, id="rows-in-blocks-shared-by-threads"),
    # the threads take runs of panels (take_size) that do not divide a block's panels
    pytest.param(300, 400, 24, id="takes-across-blocks"),
    # 19 panels of 48 (AVX-512) or 57 of 16 in one block: the last taken in shorter runs
    pytest.param(64, 912, 40, id="last-panels-in-shorter-runs"),
    pytest.param(64, 768, 300, id="decode-sized"),
]


DTYPES = [torch.float32, torch.bfloat16]


def assert_matches_float64(got: torch.Tensor, x: torch.Tensor, layer: nn.Linear) -> None:
    assert got.dtype == layer.weight.dtype
    exact = float64_linear(x, layer)
    if got.dtype == torch.float32:  # float32 sums in another order: a few ulps
        torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
    else:  # float32 sums rounded to bf16 once: within one bf16 step of the exact value
        torch.testing.assert_close(got.double(), exact, rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize(("rows", "out", "inputs"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "3-threads"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_panel_linear_matches_float64(isa, rows, out, inputs, bias, threads, dtype):
    torch.manual_seed(rows * out + inputs)
    layer = nn.Linear(inputs, out, bias=bias).to(dtype)
    x = torch.randn(rows, inputs).to(dtype)
    with num_threads(threads), torch.inference_mode():
        got = panel_linear.PanelLinear(layer, isa=isa)(x)
    assert got.shape == (rows, out)
    assert_matches_float64(got, x, layer)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_panel_linear_takes_strided_rows_and_leading_dims(isa, dtype):
    torch.manual_seed(0)
    layer = nn.Linear(40, 70).to(dtype)
    wide = torch.randn(2, 9, 64).to(dtype)
    x = wide[..., 5:45]  # rows 64 elements apart, 40 used
    with torch.inference_mode():
        got = panel_linear.PanelLinear(layer, isa=isa)(x)
    assert got.shape == (2, 9, 70)
    assert_matches_float64(got, x, layer)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_bf16_sums_round_to_nearest_even_and_keep_nan(isa):
    """Each float32 sum is rounded to bf16 as torch rounds it: a tie to the even neighbour
    (truncation, or rounding ties up, would each miss one of these), NaN as NaN."""
    ulp = 2.0**-7  # bf16's step in [1, 2)
    sums = [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 4, 1 + 3 * ulp / 4]
    layer = nn.Linear(2, 16 * len(sums), bias=False)
    with torch.no_grad():
        layer.weight.zero_()
        for j, value in enumerate(sums):  # column j (and its panel lanes): 1 * 1 + 1 * rest
            layer.weight[j :: len(sums)] = torch.tensor([1.0, value - 1])
        layer.weight[-1] = torch.tensor([float("inf"), 1.0])  # inf * 0 + 1 * 1: NaN
    layer = layer.to(torch.bfloat16)
    x = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.bfloat16)
    with torch.inference_mode():
        got = panel_linear.PanelLinear(layer, isa=isa)(x)
    want = (x.float() @ layer.weight.float().t()).to(torch.bfloat16)
    assert want[1, : len(sums)].tolist() == [1.0, 1 + 2 * ulp, 1.0, 1 + ulp]
    assert torch.equal(got[1, :-1], want[1, :-1])
    assert got[0, -1].isnan() and want[0, -1].isnan()


def test_panels_hold_the_weight_rows_transposed_with_zero_padding():
    layer = nn.Linear(3, 5, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(15.0).view(5, 3))
        layer.bias.copy_(torch.arange(5.0) + 100)
    packed = panel_linear.PanelLinear(layer, isa="baseline")
    width = panel_linear.tile_shape("baseline")[1]
    assert packed.panels.shape == (1, 3, width)  # 5 rows fit one panel
    assert packed.panels[0, :, :5].tolist() == layer.weight.t().tolist()
    assert not packed.panels[0, :, 5:].any()
    assert packed.kernel_bias is not None
    assert packed.kernel_bias.tolist() == [100.0, 101.0, 102.0, 103.0, 104.0] + [0.0] * (width - 5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_pack_linears_takes_the_panel_kernel_for_float32_on_avx2_and_avx512(isa, monkeypatch):
    monkeypatch.setattr(cpu_library, "default_isa", lambda: isa)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    pack_linears(model)
    kinds = {type(m) for m in model}
    assert kinds == ({PackedLinear} if isa == "baseline" else {panel_linear.PanelLinear})
    if isa != "baseline":
        assert {m.isa for m in model} == {isa}


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("native", [False, True], ids=["emulated-bf16", "native-bf16"])
def test_pack_linears_takes_the_panel_kernel_for_bf16_only_where_bf16_is_emulated(
    isa, native, monkeypatch
):
    monkeypatch.setattr(cpu_library, "default_isa", lambda: isa)
    flags = frozenset({"avx2", "avx512f"} | ({"avx512_bf16"} if native else set()))
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: flags)
    # the kernels of native bf16 (AMX, AVX-512-BF16) skip this shape: k is odd
    model = nn.Sequential(nn.Linear(7, 8)).to(torch.bfloat16)
    if isa != "baseline" and not native:
        pack_linears(model)
        assert isinstance(model[0], panel_linear.PanelLinear)
        assert (model[0].isa, model[0].panels.dtype) == (isa, torch.bfloat16)
    elif torch.ops.mkldnn._is_mkldnn_bf16_supported():  # else nothing packs bf16 here
        pack_linears(model)
        assert isinstance(model[0], PackedLinear)
