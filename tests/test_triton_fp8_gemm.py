"""FP8 activation quantizers on hand-made values, and the FP8 GEMMs on the GPU or in Triton's
interpreter (tests/conftest.py), each against two references:

- the same quantized operands, dequantized and multiplied in float32: ``|got - ref| <=
  rtol * |ref| + atol * max|ref|``, fp32 out rtol = atol = 2^-18 (summation order), bf16
  rtol 2^-7 (one rounding; the interpreter truncates) and atol 2^-12, fp16 rtol 2^-10 and
  atol 2^-14;
- the unquantized float32 matmul: within 2^-4 of max|ref| (e4m3 keeps 3 mantissa bits: each
  operand is off by up to 2^-4 of itself; measured worst 2^-5).
"""

import pytest
import torch

from kvserve.engine.kernels.fp8_quant import (
    FP8_DTYPE,
    FP8_MAX,
    MIN_AMAX,
    quantize_per_tensor,
    quantize_per_token,
    quantize_per_token_group,
)
from kvserve.engine.kernels.triton_fp8_gemm import (
    fp8_block_matmul,
    fp8_gemm,
    fp8_launch,
    fp8_matmul,
    uses_scaled_mm,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {  # out dtype: (rtol, atol as a fraction of the largest |ref|)
    torch.float32: (2**-18, 2**-18),
    torch.bfloat16: (2**-7, 2**-12),
    torch.float16: (2**-10, 2**-14),
}
UNQUANTIZED_TOLERANCE = 2**-4
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]
DOTS = [pytest.param(False, id="fp16-decoded-dots"), pytest.param(True, id="fp8-dots")]


def fp8(values: list[float]) -> list[float]:
    return torch.tensor(values).to(FP8_DTYPE).float().tolist()


def test_quantize_per_tensor_divides_clamps_and_rounds_to_nearest_even():
    x = torch.tensor([1.0, 34.0, 38.0, -1000.0, 1000.0, 2**-9, 3 * 2**-9, 0.0])
    xq = quantize_per_tensor(x, torch.tensor(2.0))
    assert xq.dtype == FP8_DTYPE
    # x / 2: 17 and 19 are ties between e4m3 neighbours 2 apart (16, 18, 20: even mantissas
    # 16 and 20); 2^-10 ties between 0 and the smallest subnormal 2^-9; 1.5 * 2^-9 between
    # 2^-9 and 2^-8
    assert xq.float().tolist() == [0.5, 16.0, 20.0, -448.0, 448.0, 0.0, 2**-8, 0.0]


def test_quantize_per_token_scales_each_row_by_its_largest_magnitude():
    x = torch.tensor([[1.0, -896.0, 3.0, 0.25], [0.0, 0.0, 0.0, 0.0], [7.0, 1.0, -0.5, 2.0]])
    xq, scale = quantize_per_token(x.bfloat16())
    assert (xq.dtype, scale.dtype, scale.shape) == (FP8_DTYPE, torch.float32, (3, 1))
    assert scale[:, 0].tolist() == pytest.approx([2.0, MIN_AMAX / FP8_MAX, 7.0 / 448.0], rel=1e-7)
    assert xq[0].float().tolist() == [0.5, -448.0, 1.5, 0.125]
    assert xq[1].float().tolist() == [0.0] * 4
    assert xq[2].float().tolist() == fp8([448.0, 64.0, -32.0, 128.0])


def test_quantize_per_token_group_scales_each_group_and_a_short_last_one():
    x = torch.tensor([[1.0, 2.0, -8.0, 4.0, 0.5, 0.5, 0.5, 0.25, 9.0, -3.0]])
    xq, scale = quantize_per_token_group(x, 4)
    assert (xq.shape, scale.shape) == ((1, 10), (1, 3))
    assert scale[0].tolist() == pytest.approx([8 / 448, 0.5 / 448, 9 / 448], rel=1e-7)
    expected = fp8([56.0, 112.0, -448.0, 224.0, 448.0, 448.0, 448.0, 224.0, 448.0, -149.333])
    assert xq[0].float().tolist() == expected


def test_fp8_matmul_goes_to_scaled_mm_only_with_fp8_tensor_cores_and_aligned_shapes():
    assert not uses_scaled_mm(None, 4096, 4096)  # a CPU
    assert not uses_scaled_mm((8, 0), 4096, 4096)  # A100
    assert uses_scaled_mm((8, 9), 4096, 4096)  # L4, L40S
    assert uses_scaled_mm((9, 0), 4096, 4096)  # H100, H200
    assert not uses_scaled_mm((9, 0), 4096, 200)
    assert not uses_scaled_mm((9, 0), 1000, 4096)


def quantized_weight(n: int, k: int, block: tuple[int, int] | None):
    """A random weight ``[N, K]``, float32, and its e4m3 form with dequantization scales
    per row (``block`` None) or per ``block`` (the last ones partial)."""
    w = 0.05 * torch.randn(n, k)
    if block is None:
        scale = w.abs().amax(dim=1) / FP8_MAX
        return w, (w / scale[:, None]).to(FP8_DTYPE), scale
    bn, bk = block
    rows, cols = torch.arange(n) // bn, torch.arange(k) // bk
    amax = torch.zeros(rows[-1] + 1, cols[-1] + 1)
    for i in range(amax.shape[0]):
        for j in range(amax.shape[1]):
            amax[i, j] = w[rows == i][:, cols == j].abs().max()
    scale = amax / FP8_MAX
    return w, (w / scale[rows][:, cols]).to(FP8_DTYPE), scale


def assert_within(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> None:
    error = (got.float().cpu() - ref).abs()
    bound = rtol * ref.abs() + atol * ref.abs().max()
    assert (error <= bound).all(), f"worst excess {(error - bound).max().item():.3g}"


def check(got, x, w, wq, w_scale, xq, x_scale, bias, dtype):
    """``got`` against both references (the module docstring)."""
    assert (got.dtype, got.shape) == (dtype, (x.shape[0], w.shape[0]))
    added = 0 if bias is None else bias.float()
    ref = (xq.float() * x_scale) @ (wq.float() * w_scale).t() + added
    assert_within(got, ref, *TOLERANCES[dtype])
    assert_within(got, x.float() @ w.t() + added, 0.0, UNQUANTIZED_TOLERANCE)


def expand_blocks(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]):
    return scale[torch.arange(rows) // block[0]][:, torch.arange(cols) // block[1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 40])
@pytest.mark.parametrize("static", [False, True], ids=["per-token", "static"])
def test_fp8_matmul(dtype, m, static):
    """N = 80 and K = 200: neither a multiple of the tiles (64 or 128 columns, 128 deep)."""
    torch.manual_seed(m)
    n, k = 80, 200
    w, wq, w_scale = quantized_weight(n, k, None)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    input_scale = torch.tensor(x.float().abs().max().item() / FP8_MAX) if static else None
    got = fp8_matmul(
        x.to(DEVICE),
        wq.to(DEVICE),
        w_scale.to(DEVICE),
        None if input_scale is None else input_scale.to(DEVICE),
        bias.to(DEVICE),
    )
    if static:
        xq, x_scale = quantize_per_tensor(x, input_scale), input_scale
    else:
        xq, x_scale = quantize_per_token(x)
    check(got, x, w, wq, w_scale[:, None], xq, x_scale, bias, dtype)


@pytest.mark.parametrize("fp8_dots", DOTS)
@pytest.mark.parametrize("m", [3, 40])
def test_fp8_gemm_per_channel_with_each_kind_of_dot(fp8_dots, m):
    torch.manual_seed(m + 1)
    w, wq, w_scale = quantized_weight(72, 144, None)
    x = torch.randn(m, 144)
    xq, x_scale = quantize_per_token(x)
    got = fp8_gemm(xq, x_scale, wq, w_scale, torch.float32, None, None, fp8_dots)
    check(got, x, w, wq, w_scale[:, None], xq, x_scale, None, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 40])
@pytest.mark.parametrize("block", [(32, 64), (128, 128)], ids=["block-32x64", "block-128"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_fp8_block_matmul(dtype, m, block, with_bias):
    """N = 80, K = 200: the last weight block and activation group are partial (200 = 3 *
    64 + 8 = 128 + 72; 80 = 2 * 32 + 16)."""
    torch.manual_seed(m + block[1])
    n, k = 80, 200
    w, wq, w_scale = quantized_weight(n, k, block)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if with_bias else None
    got = fp8_block_matmul(
        x.to(DEVICE),
        wq.to(DEVICE),
        w_scale.to(DEVICE),
        block,
        None if bias is None else bias.to(DEVICE),
    )
    xq, x_scale = quantize_per_token_group(x, block[1])
    check(
        got,
        x,
        w,
        wq,
        expand_blocks(w_scale, n, k, block),
        xq,
        expand_blocks(x_scale, m, k, (1, block[1])),
        bias,
        dtype,
    )


@pytest.mark.parametrize("fp8_dots", DOTS)
def test_fp8_gemm_block_scales_with_each_kind_of_dot(fp8_dots):
    """48-column groups take 16-deep K tiles, three to a group, each scaled by its group's
    scales (320 = 6 * 48 + 32: the last group two tiles)."""
    torch.manual_seed(5)
    block = (64, 48)
    assert fp8_launch(20, 48).block_k == 16
    w, wq, w_scale = quantized_weight(96, 320, block)
    x = torch.randn(20, 320)
    xq, x_scale = quantize_per_token_group(x, 48)
    got = fp8_gemm(xq, x_scale, wq, w_scale, torch.float32, None, block, fp8_dots)
    check(
        got,
        x,
        w,
        wq,
        expand_blocks(w_scale, 96, 320, block),
        xq,
        expand_blocks(x_scale, 20, 320, (1, 48)),
        None,
        torch.float32,
    )


def test_the_k_tile_divides_the_scale_group():
    assert [fp8_launch(1, k).block_k for k in (128, 256, 64, 96, 16)] == [128, 128, 64, 32, 16]
    assert (fp8_launch(16, 128).block_m, fp8_launch(17, 128).block_m) == (16, 64)


def test_fp8_block_matmul_rejects_a_block_k_not_a_multiple_of_16():
    x = torch.randn(2, 40)
    with pytest.raises(ValueError, match="multiple of 16"):
        fp8_block_matmul(x, torch.zeros(8, 40).to(FP8_DTYPE), torch.ones(1, 2), (8, 20))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="torch._scaled_mm needs FP8 tensor cores",
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("static", [False, True], ids=["per-token", "static"])
def test_fp8_matmul_through_scaled_mm(dtype, static):
    """Aligned shapes go to torch._scaled_mm, whose output is bf16 first: bf16's tolerance."""
    torch.manual_seed(9)
    n, k, m = 96, 256, 40
    assert uses_scaled_mm(torch.cuda.get_device_capability(), n, k)
    w, wq, w_scale = quantized_weight(n, k, None)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    input_scale = torch.tensor(x.float().abs().max().item() / FP8_MAX) if static else None
    got = fp8_matmul(
        x.cuda(),
        wq.cuda(),
        w_scale.cuda(),
        None if input_scale is None else input_scale.cuda(),
        bias.cuda(),
    )
    if static:
        xq, x_scale = quantize_per_tensor(x, input_scale), input_scale
    else:
        xq, x_scale = quantize_per_token(x)
    ref = (xq.float() * x_scale) @ (wq.float() * w_scale[:, None]).t() + bias.float()
    assert got.dtype == dtype
    assert_within(got, ref, *TOLERANCES[torch.bfloat16])
    assert_within(got, x.float() @ w.t() + bias.float(), 0.0, UNQUANTIZED_TOLERANCE)
