"""W4A16: 16-bit activations times 4-bit group-quantized weights (GPTQ, AWQ once repacked),
one Triton GEMM that dequantizes each weight tile in registers.

Layouts (what the loading side hands over):

- ``qweight`` int32 ``[K // 8, N]`` (``pack_int4``): word ``i`` of column ``n`` holds the
  4-bit values of input rows ``k = 8i .. 8i + 7``, row ``8i + j`` in bits ``4j .. 4j + 3``.
- ``scales``, ``zeros`` ``[G, N]`` in the activations' dtype; ``g_idx`` int32 ``[K]``, the
  group of input row ``k``: ``W[k, n] = (q[k, n] - zeros[g_idx[k], n]) * scales[g_idx[k], n]``.
  The kernel gathers scales and zeros per row through ``g_idx``, so plain group-wise
  (``k // group_size``) and GPTQ act-order (any map into ``0 .. G - 1``) take one path.

Two launches of the same kernel, picked by M: up to ``DECODE_MAX_M`` rows, one 16-row tile
and the K loop split across programs (split-K) so a decode step keeps the GPU's SMs busy,
the fp32 partial sums added in torch; past it, 64-row tiles and one program per output
tile. The dequantized tile is rounded to the activations' dtype for a native fp16/bf16
dot with fp32 accumulation; float32 activations, and bf16 under Triton's interpreter (which
multiplies bf16 dot operands as raw 16-bit patterns), dot in fp32.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DECODE_MAX_M = 16
SPLIT_K_TARGET_PROGRAMS = 128  # about one per SM of an H100/H200 (132)


@triton.jit
def w4a16_gemm_kernel(
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    k_span,
    stride_xm,
    stride_qk,
    stride_sg,
    stride_om,
    HAS_BIAS: tl.constexpr,
    NATIVE_DOTS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program ``(m tile, n tile, split)``: ``x[rows, ks] @ W[ks, cols]`` over split's
    ``k_span`` input rows (a multiple of ``BLOCK_K``). With one split it stores the tile
    (plus bias) in ``out``'s dtype; with several, fp32 partial sums to
    ``out[split, rows, cols]`` (``out`` then ``[SPLIT_K, M, N]``, row stride ``stride_om``)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < M
    col_valid = cols < N
    k_start = split * k_span
    k_end = tl.minimum(K, k_start + k_span)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_valid = ks < k_end
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=row_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        tile_mask = k_valid[:, None] & col_valid[None, :]
        words = tl.load(
            qweight_ptr + (ks // 8)[:, None].to(tl.int64) * stride_qk + cols[None, :],
            mask=tile_mask,
            other=0,
        )
        q = (words >> ((ks % 8) * 4)[:, None]) & 0xF
        groups = tl.load(g_idx_ptr + ks, mask=k_valid, other=0).to(tl.int64)
        group_offsets = groups[:, None] * stride_sg + cols[None, :]
        scale = tl.load(scales_ptr + group_offsets, mask=tile_mask, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + group_offsets, mask=tile_mask, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) - zero) * scale
        if NATIVE_DOTS:
            acc += tl.dot(x, w.to(x.dtype))
        else:
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
    out_mask = row_valid[:, None] & col_valid[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        partial = out_ptr + split.to(tl.int64) * M * stride_om
        tl.store(partial + rows[:, None] * stride_om + cols[None, :], acc, mask=out_mask)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``q`` uint8 ``[N, K]``, values 0..15, ``K % 8 == 0`` → int32 ``[K // 8, N]``: word
    ``i`` of column ``n`` holds rows ``k = 8i .. 8i + 7`` of ``q``'s transpose, row
    ``8i + j`` in bits ``4j .. 4j + 3`` (the top nibble sets the sign bit)."""
    n, k = q.shape
    if k % 8:
        raise ValueError(f"K must be a multiple of 8 to pack 4-bit values, got {k}")
    nibbles = q.t().to(torch.int32).reshape(k // 8, 8, n)
    packed = torch.zeros(k // 8, n, dtype=torch.int32, device=q.device)
    for j in range(8):
        packed |= nibbles[:, j] << (4 * j)
    return packed


@dataclass(frozen=True)
class W4A16Launch:
    """One launch's tiles, warps and K split (``split_k`` programs along K, each
    ``k_span`` rows)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    k_span: int
    num_warps: int
    num_stages: int


def w4a16_launch(m: int, n: int, k: int) -> W4A16Launch:
    """Decode-sized ``m`` (up to ``DECODE_MAX_M``): a 16-row tile, K split until about
    ``SPLIT_K_TARGET_PROGRAMS`` programs run. Prefill-sized: 64-row tiles, no split."""
    if m > DECODE_MAX_M:
        return W4A16Launch(64, 64, 64, 1, k, num_warps=4, num_stages=3)
    block_n, block_k = 64, 64
    k_blocks = triton.cdiv(k, block_k)
    wanted = max(1, SPLIT_K_TARGET_PROGRAMS // triton.cdiv(n, block_n))
    k_span = triton.cdiv(k_blocks, min(wanted, k_blocks)) * block_k
    return W4A16Launch(16, block_n, block_k, triton.cdiv(k, k_span), k_span, 4, 3)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W (+ bias)`` in ``x``'s dtype for ``x`` ``[M, K]`` (float16, bfloat16 or
    float32) and the module docstring's weight layouts (``qweight``, ``scales`` and ``zeros``
    with a unit stride along N, rows any stride apart); ``bias`` ``[N]``. Returns a new
    contiguous ``[M, N]``."""
    m, k = x.shape
    n = qweight.shape[1]
    if qweight.shape[0] * 8 != k or g_idx.shape != (k,):
        raise ValueError(
            f"x [{m}, {k}] needs qweight [{k // 8}, N] and g_idx [{k}], "
            f"got {list(qweight.shape)} and {list(g_idx.shape)}"
        )
    x = x if x.stride(1) == 1 else x.contiguous()
    launch = w4a16_launch(m, n, k)
    native = x.dtype == torch.float16 or (x.dtype == torch.bfloat16 and x.is_cuda)
    out = x.new_empty((m, n))
    target = (
        out if launch.split_k == 1 else x.new_empty((launch.split_k, m, n), dtype=torch.float32)
    )
    grid = (triton.cdiv(m, launch.block_m), triton.cdiv(n, launch.block_n), launch.split_k)
    w4a16_gemm_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        g_idx,
        x if bias is None else bias,
        target,
        m,
        n,
        k,
        launch.k_span,
        x.stride(0),
        qweight.stride(0),
        scales.stride(0),
        n,
        HAS_BIAS=bias is not None,
        NATIVE_DOTS=native,
        SPLIT_K=launch.split_k,
        BLOCK_M=launch.block_m,
        BLOCK_N=launch.block_n,
        BLOCK_K=launch.block_k,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    if launch.split_k == 1:
        return out
    summed = target.sum(0)
    if bias is not None:
        summed += bias.float()
    return out.copy_(summed)
