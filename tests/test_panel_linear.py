"""The float32 linear kernel (csrc/cpu_linear.c, through PanelLinear) against torch's own
linear, on each SIMD path this CPU has and on several threads: row counts around the
register tile and the row blocks (shared out evenly between the threads), widths that end
mid-panel, biases, strided inputs."""

import pytest
import torch
from cpu_paths import ISA_PARAMS, float64_linear, num_threads
from torch import nn

from kvserve.engine import cpu_library
from kvserve.engine.models import panel_linear
from kvserve.engine.models.packed_linear import PackedLinear, pack_linears

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
    pytest.param(64, 768, 300, id="decode-sized"),
]


def reference(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return float64_linear(x, layer).float()


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize(("rows", "out", "inputs"), SHAPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "3-threads"])
def test_panel_linear_matches_torch(isa, rows, out, inputs, bias, threads):
    torch.manual_seed(rows * out + inputs)
    layer = nn.Linear(inputs, out, bias=bias)
    x = torch.randn(rows, inputs)
    with num_threads(threads), torch.inference_mode():
        got = panel_linear.PanelLinear(layer, isa=isa)(x)
    assert (got.dtype, got.shape) == (torch.float32, (rows, out))
    # float32 sums of `inputs` products in another order: a few ulps of the largest term
    torch.testing.assert_close(got, reference(x, layer), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_panel_linear_takes_strided_rows_and_leading_dims(isa):
    torch.manual_seed(0)
    layer = nn.Linear(40, 70)
    wide = torch.randn(2, 9, 64)
    x = wide[..., 5:45]  # rows 64 floats apart, 40 used
    with torch.inference_mode():
        got = panel_linear.PanelLinear(layer, isa=isa)(x)
    assert got.shape == (2, 9, 70)
    torch.testing.assert_close(got, reference(x, layer), rtol=1e-5, atol=1e-5)


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
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        bf16 = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
        pack_linears(bf16)
        assert isinstance(bf16[0], PackedLinear)
