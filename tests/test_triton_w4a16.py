"""The W4A16 GEMM against a float32 matmul with the dequantized weight, on the GPU or in
Triton's interpreter (tests/conftest.py), and pack_int4's bit layout.

Tolerances, per output element, against ``ref = x.float() @ W + bias`` with ``scale`` the
largest ``|ref|``: ``|got - ref| <= rtol * |ref| + atol * scale``. The kernel rounds the
dequantized weight to the activations' dtype (2^-11 relative in fp16, 2^-9 in bf16) and the
output once (the interpreter's bf16 casts truncate: 2^-7 relative), accumulating in fp32.
fp16: rtol 2^-9, atol 2^-10; bf16: rtol 2^-7, atol 2^-8; fp32: rtol = atol = 2^-18 (measured
worst in the interpreter: 2^-11.2, 2^-7.6 and 2^-20.7 of the largest |ref|).
"""

import pytest
import torch

from kvserve.engine.kernels.triton_w4a16 import (
    DECODE_MAX_M,
    pack_int4,
    w4a16_launch,
    w4a16_matmul,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {  # dtype: (rtol, atol as a fraction of the largest |ref|)
    torch.float16: (2**-9, 2**-10),
    torch.bfloat16: (2**-7, 2**-8),
    torch.float32: (2**-18, 2**-18),
}
DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float32, id="fp32"),
]


def quantized_weight(
    n: int, k: int, group_size: int, act_order: bool, symmetric: bool, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """A random 4-bit weight, ``[K, N]`` once dequantized (``w``, float32), and its parts."""
    groups = k // group_size
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    g_idx = torch.arange(k, dtype=torch.int32) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(k)]
    scales = (0.01 + 0.02 * torch.rand(groups, n)).to(dtype)
    if symmetric:
        zeros = torch.full((groups, n), 8.0).to(dtype)
    else:
        zeros = torch.randint(0, 16, (groups, n)).to(dtype)
    gathered = g_idx.long()
    w = (q.t().float() - zeros.float()[gathered]) * scales.float()[gathered]
    return dict(q=q, g_idx=g_idx, scales=scales, zeros=zeros, w=w)


def assert_matches(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCES[dtype]
    assert got.dtype == dtype and got.shape == ref.shape
    error = (got.float().cpu() - ref).abs()
    bound = rtol * ref.abs() + atol * ref.abs().max()
    assert (error <= bound).all(), f"worst excess {(error - bound).max().item():.3g}"


def run_case(m, n, k, group_size, act_order, symmetric, with_bias, dtype):
    torch.manual_seed(m * 7919 + n * 31 + k + group_size)
    weight = quantized_weight(n, k, group_size, act_order, symmetric, dtype)
    x = torch.randn(m, k + 24).to(dtype)[:, 8 : k + 8]  # rows k + 24 apart
    bias = torch.randn(n).to(dtype) if with_bias else None
    ref = x.float() @ weight["w"] + (0 if bias is None else bias.float())
    got = w4a16_matmul(
        x.to(DEVICE),
        pack_int4(weight["q"]).to(DEVICE),
        weight["scales"].to(DEVICE),
        weight["zeros"].to(DEVICE),
        weight["g_idx"].to(DEVICE),
        None if bias is None else bias.to(DEVICE),
    )
    assert_matches(got, ref, dtype)


def test_pack_int4_puts_row_8i_plus_j_in_bits_4j_of_word_i():
    q = torch.zeros(2, 16, dtype=torch.uint8)  # [N, K]
    q[0, :8] = torch.arange(8)  # column 0, word 0: nibble j holds j
    q[0, 8:] = 15  # column 0, word 1: all ones, the sign bit set
    q[1, 3] = 9  # column 1, word 0: row 3, bits 12..15
    q[1, 14] = 1  # column 1, word 1: row 14 = 8 + 6, bits 24..27
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (2, 2)
    expected = [[0x76543210, 0x9000], [-1, 1 << 24]]
    assert packed.tolist() == expected


def test_pack_int4_rejects_k_not_a_multiple_of_8():
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4(torch.zeros(4, 12, dtype=torch.uint8))


def test_small_m_splits_k_and_large_m_takes_wide_tiles():
    decode = w4a16_launch(1, 4096, 4096)
    assert (decode.block_m, decode.split_k) == (16, 2)  # 64 column tiles, 2 splits: 128 programs
    assert decode.split_k * decode.k_span >= 4096 > (decode.split_k - 1) * decode.k_span
    assert w4a16_launch(DECODE_MAX_M, 256, 4096).split_k == 32  # 4 tiles: K split 32 ways
    prefill = w4a16_launch(DECODE_MAX_M + 1, 4096, 4096)
    assert (prefill.block_m, prefill.split_k, prefill.k_span) == (64, 1, 4096)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("act_order", [False, True], ids=["contiguous", "act-order"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_group_sizes_and_group_maps(group_size, act_order, symmetric):
    """Decode-sized (split K) and prefill-sized, bf16, N = 80 (not a tile multiple)."""
    for m in (1, 33):
        run_case(m, 80, 256, group_size, act_order, symmetric, True, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, DECODE_MAX_M, 70])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_each_dtype_and_batch_size(dtype, m, with_bias):
    """M from one row to past one 64-row tile; K = 320 splits unevenly into 64-row blocks."""
    run_case(m, 72, 320, 64, True, False, with_bias, dtype)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the interpreter's bf16 dots are wrong")
def test_native_bf16_dots_on_the_gpu():
    run_case(200, 1000, 1024, 128, True, False, True, torch.bfloat16)
