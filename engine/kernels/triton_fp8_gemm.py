"""W8A8 FP8 (e4m3fn) GEMMs: per-output-channel weight scales (``fp8_matmul``) and
DeepSeek-V3 / Qwen3-FP8 block-wise scales (``fp8_block_matmul``).

Layouts: activations ``x`` ``[M, K]``; the weight ``[N, K]`` (the checkpoint's, K
contiguous); scales are dequantization scales, float32 (``W ≈ Wq * scale``). Per channel:
``weight_scale [N]``, the activations' scale ``[M, 1]`` (per token, or one static scale
seen as a column with stride 0). Block-wise, ``block = (bn, bk)``: ``weight_scale
[ceil(N / bn), ceil(K / bk)]``, one per ``bn x bk`` block, the activations' ``[M,
ceil(K / bk)]``, one per token per ``bk`` columns (``quantize_per_token_group``).

Where the GPU has FP8 tensor cores (CUDA capability 8.9 and up) and the shapes suit it,
per-channel goes to ``torch._scaled_mm`` (row-wise scales, bf16 out); everything else runs
the Triton kernel below. Its dots are native FP8 on those GPUs; elsewhere (an A100, the
interpreter on a CPU) it decodes the FP8 bits into fp16 (exactly: every e4m3 value is an fp16
value times 2^8) and dots in fp16. Both accumulate in fp32.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvserve.engine.kernels.fp8_quant import (
    quantize_per_tensor,
    quantize_per_token,
    quantize_per_token_group,
)

FP8_TENSOR_CORES = (8, 9)
DECODE_MAX_M = 16
E4M3_IN_FP16 = tl.constexpr(2.0**8)  # _e4m3_as_fp16 gives each operand over this


@triton.jit
def _e4m3_as_fp16(bits):
    """e4m3fn bit patterns (uint8) → fp16 holding each value / 2^8, exactly: the sign moves
    to bit 15 and exponent-and-mantissa to bits 7..14, so e4m3's exponent bias of 7 reads as
    fp16's 15 (subnormals line up as well). NaN (0x7F, 0xFF) reads as ±480 / 2^8."""
    b = bits.to(tl.int32)
    return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def fp8_gemm_kernel(
    a_ptr,
    b_ptr,
    a_scale_ptr,
    b_scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_asm,
    stride_bsn,
    stride_om,
    BLOCK_SCALES: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    FP8_DOTS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program ``(m tile, n tile)``: ``out = (A * a_scale) @ (B * b_scale)^T (+ bias)``, A
    ``[M, K]`` and B ``[N, K]`` FP8 (as uint8 bit patterns unless ``FP8_DOTS``), K
    contiguous. ``BLOCK_SCALES``: scales per K group, ``a_scale[m, k // GROUP_K]`` and
    ``b_scale[n // GROUP_N, k // GROUP_K]``, applied to each K tile's dot (``BLOCK_K``
    divides ``GROUP_K``); otherwise ``a_scale[m]`` and ``b_scale[n]`` (``GROUP_N`` 1,
    ``GROUP_K`` unread), applied once at the end. Scale rows are ``stride_asm`` and
    ``stride_bsn`` apart, groups adjacent."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < M
    col_valid = cols < N
    a_rows = a_ptr + rows[:, None].to(tl.int64) * stride_am
    b_cols = b_ptr + cols[None, :].to(tl.int64) * stride_bn
    a_scale_rows = a_scale_ptr + rows * stride_asm
    b_scale_rows = b_scale_ptr + (cols // GROUP_N) * stride_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_valid = ks < K
        a = tl.load(a_rows + ks[None, :], mask=row_valid[:, None] & k_valid[None, :], other=0.0)
        b = tl.load(b_cols + ks[:, None], mask=k_valid[:, None] & col_valid[None, :], other=0.0)
        if not FP8_DOTS:
            a = _e4m3_as_fp16(a)
            b = _e4m3_as_fp16(b)
        if BLOCK_SCALES:
            group = k0 // GROUP_K
            a_scale = tl.load(a_scale_rows + group, mask=row_valid, other=0.0)
            b_scale = tl.load(b_scale_rows + group, mask=col_valid, other=0.0)
            acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
        else:
            acc = tl.dot(a, b, acc)
    if not BLOCK_SCALES:
        a_scale = tl.load(a_scale_rows, mask=row_valid, other=0.0)
        b_scale = tl.load(b_scale_rows, mask=col_valid, other=0.0)
        acc = acc * a_scale[:, None] * b_scale[None, :]
    if not FP8_DOTS:
        acc = acc * (E4M3_IN_FP16 * E4M3_IN_FP16)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & col_valid[None, :])


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """The device's CUDA compute capability, None off CUDA."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def has_fp8_tensor_cores(capability: tuple[int, int] | None) -> bool:
    return capability is not None and capability >= FP8_TENSOR_CORES


def uses_scaled_mm(capability: tuple[int, int] | None, n: int, k: int) -> bool:
    """Whether ``fp8_matmul`` goes to ``torch._scaled_mm``: FP8 tensor cores, and N and K
    multiples of 16 (its operands' rows must be 16-byte aligned)."""
    return has_fp8_tensor_cores(capability) and n % 16 == 0 and k % 16 == 0


@dataclass(frozen=True)
class FP8Launch:
    """One launch's tiles and warps."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int


def fp8_launch(m: int, group_k: int) -> FP8Launch:
    """Decode-sized ``m`` (up to ``DECODE_MAX_M``): 16 x 64 tiles, four warps; larger: 64 x
    128, eight (at four, sm_90's block-scaled kernel holds 240 registers a thread). The K
    tile is 128 deep, or the largest power of two dividing ``group_k`` (the block's K size,
    a multiple of 16) so that no tile straddles two scale groups."""
    if group_k % 16:
        raise ValueError(f"the block's K size must be a multiple of 16, got {group_k}")
    block_k = 128
    while group_k % block_k:
        block_k //= 2
    if m <= DECODE_MAX_M:
        return FP8Launch(16, 64, block_k, 4)
    return FP8Launch(64, 128, block_k, 8)


def fp8_gemm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
    block: tuple[int, int] | None,
    fp8_dots: bool,
) -> torch.Tensor:
    """The Triton kernel on quantized operands (the module docstring's layouts): ``xq``
    ``[M, K]`` and ``weight`` ``[N, K]`` FP8 with K contiguous; ``block`` None for per-channel
    scales. ``fp8_dots`` picks native FP8 dots over the fp16 decode."""
    m, k = xq.shape
    n = weight.shape[0]
    group_n, group_k = (1, 128) if block is None else block
    launch = fp8_launch(m, group_k)
    if not fp8_dots:
        xq, weight = xq.view(torch.uint8), weight.view(torch.uint8)
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    fp8_gemm_kernel[(triton.cdiv(m, launch.block_m), triton.cdiv(n, launch.block_n))](
        xq,
        weight,
        x_scale,
        weight_scale,
        out if bias is None else bias,
        out,
        m,
        n,
        k,
        xq.stride(0),
        weight.stride(0),
        x_scale.stride(0),
        weight_scale.stride(0),
        out.stride(0),
        BLOCK_SCALES=block is not None,
        GROUP_N=group_n,
        GROUP_K=group_k,
        FP8_DOTS=fp8_dots,
        HAS_BIAS=bias is not None,
        BLOCK_M=launch.block_m,
        BLOCK_N=launch.block_n,
        BLOCK_K=launch.block_k,
        num_warps=launch.num_warps,
        num_stages=3,
    )
    return out


def fp8_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(xq * xs) @ (W * ws[:, None])^T (+ bias)`` in ``x``'s dtype: ``x`` ``[M, K]``
    (bf16, fp16 or fp32) quantized with the static per-tensor ``input_scale`` (0-d float32)
    or, when None, per token; ``weight`` e4m3fn ``[N, K]``; ``weight_scale`` float32 ``[N]``.
    Through ``torch._scaled_mm`` the product is rounded to bf16 before any cast to ``x``'s
    dtype (its row-wise scaling has no other output type on every GPU)."""
    m, k = x.shape
    n = weight.shape[0]
    if input_scale is None:
        xq, x_scale = quantize_per_token(x)
    else:
        xq = quantize_per_tensor(x, input_scale)
        x_scale = input_scale.float().reshape(1, 1).expand(m, 1)
    capability = cuda_capability(x.device)
    if not uses_scaled_mm(capability, n, k):
        return fp8_gemm(
            xq, x_scale, weight, weight_scale, x.dtype, bias, None, has_fp8_tensor_cores(capability)
        )
    bf16_bias = bias is not None and bias.dtype == torch.bfloat16
    out = torch._scaled_mm(
        xq,
        weight.t(),
        scale_a=x_scale.contiguous(),
        scale_b=weight_scale.reshape(1, n).contiguous(),
        bias=bias if bf16_bias else None,
        out_dtype=torch.bfloat16,
    ).to(x.dtype)
    return out if bias is None or bf16_bias else out + bias


def fp8_block_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block-wise FP8 (the module docstring's layouts; ``block = (bn, bk)``, ``bk`` a
    multiple of 16): ``x`` quantized per token per ``bk`` columns, each K tile's dot scaled by
    its activation group scale and weight block scale. Returns ``[M, N]`` in ``x``'s dtype."""
    xq, x_scale = quantize_per_token_group(x, block[1])
    fp8_dots = has_fp8_tensor_cores(cuda_capability(x.device))
    return fp8_gemm(xq, x_scale, weight, weight_scale.contiguous(), x.dtype, bias, block, fp8_dots)
