"""The fused kernels (RMSNorm with its residual add, SiLU-and-mul, RoPE) against the torch
expressions they replace: the C kernels on each SIMD path this CPU has and on several
threads; the Triton kernels on the GPU, or in Triton's interpreter where none is."""

import pytest
import torch
from cpu_paths import ISA_PARAMS, num_threads

from kvserve.engine.kernels import triton_fused
from kvserve.engine.layers import fused_ops
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.models.model_config import RopeConfig

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_ROUNDS = DEVICE.type == "cuda"  # compiled; the interpreter's bf16 casts truncate


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    with num_threads(request.param):
        yield request.param


def assert_close(got: torch.Tensor, expected: torch.Tensor, rounded: bool = True) -> None:
    """float32: equal to rounding; bf16: within bf16's own tolerance, and nearly always
    bit-equal (the kernels round where torch rounds; expf differs in its last float32 bits,
    which moves a product's rounding now and then). ``rounded=False``: Triton's
    interpreter, whose casts to bf16 truncate: within a 64th of the largest value (two
    units in bf16's last place; a difference of truncated products can cancel, so the
    error is measured against the tensor's scale, as the attention tests do)."""
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6)
    elif not rounded:
        scale = expected.float().abs().max()
        assert (got.float() - expected.float()).abs().max() <= scale * 2**-6
    else:
        torch.testing.assert_close(got, expected)
        assert (got != expected).float().mean().item() < 0.01


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add-norm"])
def test_rms_norm_matches_torch(isa, dtype, with_residual, threads):
    torch.manual_seed(0)
    x = torch.randn(37, 200).to(dtype)
    weight = (1 + 0.1 * torch.randn(200)).to(dtype)
    residual = torch.randn(37, 200).to(dtype) if with_residual else None
    expected_residual = None if residual is None else residual.clone()
    expected = fused_ops.rms_norm_reference(x, weight, 1e-5, expected_residual)
    got = fused_ops.rms_norm(x, weight, 1e-5, residual, isa=isa)
    assert_close(got, expected)
    if residual is not None:
        assert torch.equal(residual, expected_residual)  # residual += x, rounded as torch's add


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_heads_in_strided_rows_matches_torch(isa, dtype, threads):
    """Qwen3's per-head norm on q's view of a qkv row (5 heads of 32, rows 320 apart)."""
    torch.manual_seed(6)
    qkv = torch.randn(7, 320).to(dtype)
    q = qkv[:, :160].view(7, 5, 32)
    weight = (1 + 0.1 * torch.randn(32)).to(dtype)
    before = qkv.clone()
    got = fused_ops.rms_norm(q, weight, 1e-6, isa=isa)
    assert got.is_contiguous() and torch.equal(qkv, before)
    assert_close(got, fused_ops.rms_norm_reference(q, weight, 1e-6))


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [300, 2048], ids=["short-row", "rows-past-a-chunk"])
def test_silu_and_mul_matches_torch(isa, dtype, width, threads):
    torch.manual_seed(1)
    gate_up = (3 * torch.randn(19, 2 * width)).to(dtype)
    assert_close(
        fused_ops.silu_and_mul(gate_up, isa=isa), fused_ops.silu_and_mul_reference(gate_up)
    )


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_rotates_strided_q_and_k_in_place_as_torch_does(isa, dtype, threads):
    """q and k are views into one qkv projection output (rows 2 * 6 * 32 + 2 * 32 apart),
    as the decoder hands them over; GQA (6 query heads, 2 kv heads)."""
    torch.manual_seed(2)
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), 32, 256)
    rotary.build(dtype, torch.device("cpu"))
    qkv = torch.randn(11, 6 * 32 + 2 * 2 * 32).to(dtype)
    q = qkv[:, : 6 * 32].view(11, 6, 32)
    k = qkv[:, 6 * 32 : 8 * 32].view(11, 2, 32)
    v_before = qkv[:, 8 * 32 :].clone()
    positions = torch.tensor([0, 1, 2, 5, 17, 100, 101, 255, 3, 3, 64])
    expected_q, expected_k = fused_ops.rope_reference(positions, q, k, rotary.cos_sin)
    got_q, got_k = fused_ops.rope(positions, q, k, rotary.cos_sin, isa=isa)
    assert (got_q.data_ptr(), got_k.data_ptr()) == (q.data_ptr(), k.data_ptr())
    assert_close(got_q, expected_q)
    assert_close(got_k, expected_k)
    assert torch.equal(qkv[:, 8 * 32 :], v_before)


def test_layouts_the_kernels_do_not_take_run_the_torch_path():
    x = torch.randn(8, 64)[:, ::2]  # not contiguous
    weight = torch.ones(32)
    assert torch.equal(
        fused_ops.rms_norm(x, weight, 1e-6), fused_ops.rms_norm_reference(x, weight, 1e-6)
    )
    gate_up = torch.randn(4, 16).half()  # float16: no kernel
    assert torch.equal(fused_ops.silu_and_mul(gate_up), fused_ops.silu_and_mul_reference(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add-norm"])
def test_triton_rms_norm_matches_torch(dtype, with_residual):
    """Rows 200 wide (not a power of two), x a strided view of a wider buffer."""
    torch.manual_seed(3)
    x = torch.randn(37, 256).to(DEVICE, dtype)[:, :200]
    weight = (1 + 0.1 * torch.randn(200)).to(DEVICE, dtype)
    residual = torch.randn(37, 200).to(DEVICE, dtype) if with_residual else None
    expected_residual = None if residual is None else residual.clone()
    expected = fused_ops.rms_norm_reference(x, weight, 1e-5, expected_residual)
    got = triton_fused.rms_norm(x, weight, 1e-5, residual)
    assert_close(got, expected, TRITON_ROUNDS)
    if residual is not None and TRITON_ROUNDS:
        assert torch.equal(residual, expected_residual)
    elif residual is not None:
        assert_close(residual, expected_residual, rounded=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [300, 1500], ids=["one-tile", "two-tiles"])
def test_triton_silu_and_mul_matches_torch(dtype, width):
    torch.manual_seed(4)
    gate_up = (3 * torch.randn(19, 2 * width)).to(DEVICE, dtype)
    got = triton_fused.silu_and_mul(gate_up)
    assert_close(got, fused_ops.silu_and_mul_reference(gate_up), TRITON_ROUNDS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 80])
def test_triton_rope_rotates_strided_q_and_k_in_place_as_torch_does(dtype, head_dim):
    """As the C kernels' test: q and k are views into one qkv row (GQA, 6 and 2 heads);
    head_dim 80 has halves of 40, not a power of two. The kernel rounds the rotated value
    once; torch rounds both products and their sum: in bf16 the two differ by at most a
    64th of the products' size (four units of bf16's rounding, the cancellations
    included), far under what a wrong angle or sign gives."""
    torch.manual_seed(5)
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), head_dim, 256)
    rotary.build(dtype, DEVICE)
    qkv = torch.randn(11, 10 * head_dim).to(DEVICE, dtype)
    q = qkv[:, : 6 * head_dim].view(11, 6, head_dim)
    k = qkv[:, 6 * head_dim : 8 * head_dim].view(11, 2, head_dim)
    v_before = qkv[:, 8 * head_dim :].clone()
    positions = torch.tensor([0, 1, 2, 5, 17, 100, 101, 255, 3, 3, 64], device=DEVICE)
    assert fused_ops.takes_heads(q, k, rotary.cos_sin)
    expected_q, expected_k = fused_ops.rope_reference(positions, q, k, rotary.cos_sin)
    scales = [products_size(positions, x, rotary.cos_sin) for x in (q, k)]
    got_q, got_k = triton_fused.rope(positions, q, k, rotary.cos_sin)
    assert (got_q.data_ptr(), got_k.data_ptr()) == (q.data_ptr(), k.data_ptr())
    for got, expected, scale in zip((got_q, got_k), (expected_q, expected_k), scales, strict=True):
        if dtype == torch.float32:
            assert_close(got, expected)
        else:
            assert ((got.float() - expected.float()).abs() <= scale * 2**-6).all()
    assert torch.equal(qkv[:, 8 * head_dim :], v_before)


def products_size(positions, x, cos_sin) -> torch.Tensor:
    """``|x cos| + |rotate(x) sin|`` per element, in fp32: the size of the two products
    whose sum is the rotated element."""
    cos, sin = cos_sin[:, positions].float().abs().unsqueeze(2)
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1).float().abs()
    return x.float().abs() * cos + swapped * sin


def test_triton_layouts():
    rows = torch.zeros(4, 8)
    assert fused_ops.takes_rows(rows, rows[:, :6])
    assert not fused_ops.takes_rows(rows.t()) and not fused_ops.takes_rows(rows.view(2, 2, 8))
    q, k, table = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8), torch.zeros(2, 16, 8)
    assert fused_ops.takes_heads(q, k, table)
    assert not fused_ops.takes_heads(q[..., :7], k[..., :7], table)
    assert not fused_ops.takes_heads(q, k.transpose(1, 2), table)
