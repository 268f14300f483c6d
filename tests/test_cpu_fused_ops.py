"""The fused CPU kernels (RMSNorm with its residual add, SiLU-and-mul, RoPE) against the
torch expressions they replace, on each SIMD path this CPU has and on several threads."""

import pytest
import torch
from cpu_paths import ISA_PARAMS, num_threads

from kvserve.engine.models import fused_ops
from kvserve.engine.models.model_config import RopeConfig
from kvserve.engine.models.rope import RotaryEmbedding

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    with num_threads(request.param):
        yield request.param


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """float32: equal to rounding; bf16: within bf16's own tolerance, and nearly always
    bit-equal (the kernels round where torch rounds; expf differs in its last float32 bits,
    which moves a product's rounding now and then)."""
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6)
        return
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
