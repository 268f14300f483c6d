"""The decoder's elementwise ops as one Triton kernel each, for the GPU: RMSNorm with the
residual add before it, SiLU-and-mul, and RoPE in place.

Unfused, a bf16 RMSNorm is seven kernels and RoPE of q and k ten; in a decode step of a
small batch each of them costs a few microseconds of launch and ramp for almost no work,
about a sixth of the step on an H200 (benchmarks/gpu-levers.md). Each kernel loads in the
activations' dtype and computes in fp32. RMSNorm and SiLU-and-mul round where the torch
reference in ``fused_ops`` rounds, and match it bit for bit nearly everywhere; RoPE rounds
once, where torch rounds both products and then their sum (a version rounding as torch
does still differed from it on an H200 where the two products cancel). Under
``TRITON_INTERPRET=1`` they run on CPU tensors (the tests), where a cast to bf16 truncates
instead of rounding to nearest.
"""

import torch
import triton
import triton.language as tl

SILU_BLOCK = 1024


@triton.jit
def rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    x_stride,
    residual_stride,
    out_stride,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``row``: with a residual, ``residual[row] += x[row]`` (rounded to its dtype)
    and the sum is normalised; ``out[row] = weight * (s / rms(s))``, the normalised row
    rounded to the dtype before the weight multiplies it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=valid, other=0.0)
    dtype = x.dtype
    s = x.to(tl.float32)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + row * residual_stride + cols
        summed = (tl.load(r_ptrs, mask=valid, other=0.0).to(tl.float32) + s).to(dtype)
        tl.store(r_ptrs, summed, mask=valid)
        s = summed.to(tl.float32)
    normed = (s * tl.rsqrt(tl.sum(s * s, 0) / n + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * weight).to(dtype), mask=valid)


@triton.jit
def silu_and_mul_kernel(gate_up_ptr, out_ptr, in_stride, out_stride, n, BLOCK: tl.constexpr):
    """Program ``(row, tile)``: ``out = silu(gate) * up`` over ``BLOCK`` columns, silu's
    result rounded to the dtype before the product, as torch rounds it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n
    gate = tl.load(gate_up_ptr + row * in_stride + cols, mask=valid, other=0.0)
    up = tl.load(gate_up_ptr + row * in_stride + n + cols, mask=valid, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(
        out_ptr + row * out_stride + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=valid
    )


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_token,
    stride_head,
    token,
    num_heads,
    cos,
    sin,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    first = x_ptr + token * stride_token + heads * stride_head + dims
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_stride_token,
    q_stride_head,
    k_stride_token,
    k_stride_head,
    table_stride,
    num_q_heads,
    num_k_heads,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """Program ``token`` rotates every q and k head of its token in place by its position
    (half-split layout): ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``, with the
    ``cos`` and ``sin`` rows of ``cos_sin`` ``[2, max_positions, 2 * HALF]`` (each row's
    halves are equal)."""
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token)
    dims = tl.arange(0, HALF_PAD)[None, :]
    row = position * 2 * HALF + dims
    cos = tl.load(cos_sin_ptr + row, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + table_stride + row, mask=dims < HALF, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_stride_token,
        q_stride_head,
        token,
        num_q_heads,
        cos,
        sin,
        Q_HEADS_PAD,
        HALF,
        HALF_PAD,
    )
    _rotate_heads(
        k_ptr,
        k_stride_token,
        k_stride_head,
        token,
        num_k_heads,
        cos,
        sin,
        K_HEADS_PAD,
        HALF,
        HALF_PAD,
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> torch.Tensor:
    """``fused_ops.rms_norm`` on 2-D rows with a unit stride (``fused_ops.takes_rows``)."""
    out = torch.empty_like(x)
    rows, n = x.shape
    rms_norm_kernel[(rows,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        out.stride(0),
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(n),
        num_warps=8 if n >= 2048 else 4,
    )
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``fused_ops.silu_and_mul`` on 2-D rows with a unit stride."""
    rows, width = gate_up.shape
    n = width // 2
    out = gate_up.new_empty((rows, n))
    silu_and_mul_kernel[(rows, triton.cdiv(n, SILU_BLOCK))](
        gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=SILU_BLOCK
    )
    return out


def rope(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_ops.rope`` in place on ``[tokens, heads, head_dim]`` views
    (``fused_ops.takes_heads``)."""
    half = q.shape[2] // 2
    rope_kernel[(q.shape[0],)](
        q,
        k,
        positions,
        cos_sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin.stride(0),
        q.shape[1],
        k.shape[1],
        Q_HEADS_PAD=triton.next_power_of_2(q.shape[1]),
        K_HEADS_PAD=triton.next_power_of_2(k.shape[1]),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
    )
    return q, k
