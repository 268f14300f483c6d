"""Fused mixture-of-experts: ``T`` tokens, each routed to ``K`` of ``E`` experts, through the
experts' gated MLPs, in two grouped Triton GEMMs.

1. ``moe_align`` sorts the ``T * K`` (token, choice) slots by expert and pads each expert's
   run to the row block, so each row block of a GEMM reads one expert's weights.
2. Gate/up GEMM: row block ``b`` multiplies its slots' tokens by expert ``e``'s ``w13``
   gate rows and up rows side by side, adds ``w13_bias``, applies the activation in the
   epilogue and stores ``[T * K, I]`` in ``hidden``'s dtype.
3. Down GEMM: the same blocks through ``w2``, plus ``w2_bias``, times each slot's routing
   weight, stored in float32 ``[T * K, H]``.
4. The sum over each token's ``K`` slots, rounded once to ``hidden``'s dtype.

Weights are dense (``hidden``'s dtype, input features contiguous) or MXFP4 (``Mxfp4Weight``,
the layout in ``mxfp4``), decoded tile by tile in the GEMMs' inner loop. Products accumulate
in float32: native fp16/bf16 dots on the GPU, fp32 dots for float32 inputs and under
Triton's interpreter for bf16 (which multiplies bf16 dot operands as raw 16-bit patterns).

Tensor parallelism shards ``I``: each rank passes its slice of the gate rows and of the up
rows (``w13`` ``[E, 2 * I / tp, H]``) and of ``w2``'s inputs, gets its partial sum, and
the caller all-reduces. ``w2_bias`` must be passed on one rank only, or it is added ``tp``
times; ``w13_bias`` is sliced like ``w13``.
"""

from typing import Literal

import torch
import triton
import triton.language as tl

from .fused_moe_config import MoeTile, pick_tile
from .moe_align import moe_align
from .mxfp4 import Mxfp4Weight, check_mxfp4

Activation = Literal["silu", "swigluoai"]
ACTIVATIONS: dict[str, int] = {"silu": 0, "swigluoai": 1}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ExpertWeight = torch.Tensor | Mxfp4Weight


@triton.jit
def _weight_tile(
    w_ptr,
    scales_ptr,
    rows,
    ks,
    mask,
    stride_wn,
    stride_sn,
    MXFP4: tl.constexpr,
):
    """One expert's ``W[rows, ks]`` as a ``[BLOCK_K, BLOCK_N]`` tile (``w_ptr`` and
    ``scales_ptr`` already at the expert). Dense: the stored values. MXFP4: ``w_ptr`` the
    ``[N, K / 2]`` bytes, decoded to float32 (exact)."""
    if MXFP4:
        byte = tl.load(w_ptr + rows[None, :] * stride_wn + (ks // 2)[:, None], mask=mask, other=0)
        code = (byte >> ((ks % 2) * 4)[:, None]) & 0xF
        exponent = (code >> 1) & 3
        mantissa = (code & 1).to(tl.float32)
        magnitude = tl.where(
            exponent == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * tl.exp2(exponent - 1.0)
        )
        value = tl.where(code >= 8, -magnitude, magnitude)
        scale = tl.load(
            scales_ptr + rows[None, :] * stride_sn + (ks // 32)[:, None], mask=mask, other=0
        )
        return value * tl.exp2(scale.to(tl.float32) - 127.0)
    else:
        return tl.load(w_ptr + rows[None, :] * stride_wn + ks[:, None], mask=mask, other=0.0)


@triton.jit
def _dot(a, w, NATIVE_DOTS: tl.constexpr):
    if NATIVE_DOTS:
        return tl.dot(a, w.to(a.dtype))
    else:
        return tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")


@triton.jit
def moe_gemm_kernel(
    a_ptr,
    w_ptr,
    scales_ptr,
    bias_ptr,
    out_ptr,
    topk_weights_ptr,
    sorted_slots_ptr,
    block_experts_ptr,
    padded_count_ptr,
    N,
    K,
    num_slots,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_be,
    stride_om,
    A_ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    WEIGHTED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    NATIVE_DOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program ``(row block, column tile)``: for the block's slots ``s`` (``sorted_slots``),
    ``a[s // A_ROW_DIV] @ W_e[cols].T`` with ``e`` the block's expert, stored to
    ``out[s, cols]``. ``GATED``: also ``W_e[N + cols]`` (the up rows), and
    ``act(gate, up)`` stored. ``WEIGHTED``: times ``topk_weights[s]``. Blocks past the
    padded count return at once; padding slots (``== num_slots``) load zeros and store
    nothing."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(padded_count_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    slots = tl.load(sorted_slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    slot_valid = slots < num_slots
    a_rows = (slots // A_ROW_DIV).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < N
    w_expert = w_ptr + expert * stride_we
    s_expert = scales_ptr + expert * stride_se
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_valid = ks < K
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + ks[None, :],
            mask=slot_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        w_mask = k_valid[:, None] & col_valid[None, :]
        w = _weight_tile(w_expert, s_expert, cols, ks, w_mask, stride_wn, stride_sn, MXFP4)
        acc += _dot(a, w, NATIVE_DOTS)
        if GATED:
            w = _weight_tile(w_expert, s_expert, N + cols, ks, w_mask, stride_wn, stride_sn, MXFP4)
            acc_up += _dot(a, w, NATIVE_DOTS)
    if HAS_BIAS:
        bias = bias_ptr + expert * stride_be + cols
        acc += tl.load(bias, mask=col_valid, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias + N, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if ACTIVATION == 0:  # silu(gate) * up
            acc = acc * tl.sigmoid(acc) * acc_up
        else:  # swigluoai: gpt-oss's clamped gate and up
            gate = tl.minimum(acc, 7.0)
            up = tl.minimum(tl.maximum(acc_up, -7.0), 7.0)
            acc = (up + 1.0) * gate * tl.sigmoid(1.702 * gate)
    if WEIGHTED:
        acc *= tl.load(topk_weights_ptr + slots, mask=slot_valid, other=0.0)[:, None]
    out = out_ptr + slots[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=slot_valid[:, None] & col_valid[None, :])


def weight_format(weight: ExpertWeight) -> str:
    """``"mxfp4"`` or the dense weight's dtype name (``"bfloat16"``): a config key."""
    return "mxfp4" if isinstance(weight, Mxfp4Weight) else str(weight.dtype).removeprefix("torch.")


def _expert_shape(name: str, weight: ExpertWeight, dtype: torch.dtype) -> tuple[int, int, int]:
    if isinstance(weight, Mxfp4Weight):
        try:
            check_mxfp4(weight.blocks, weight.scales)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
        if weight.blocks.dim() != 4:
            raise ValueError(f"{name}.blocks must be [E, N, K/32, 16], got {weight.blocks.shape}")
        return weight.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3 or weight.dtype != dtype:
        raise ValueError(
            f"{name} must be a [E, N, K] tensor in hidden's dtype {dtype} or an Mxfp4Weight, "
            f"got {getattr(weight, 'dtype', type(weight).__name__)} "
            f"{list(getattr(weight, 'shape', []))}"
        )
    e, n, k = weight.shape
    return e, n, k


def _check_bias(name: str, bias: torch.Tensor | None, shape: tuple[int, int]) -> None:
    if bias is not None and (tuple(bias.shape) != shape or not bias.dtype.is_floating_point):
        raise ValueError(
            f"{name} must be a floating [{shape[0]}, {shape[1]}] tensor, got {bias.dtype} "
            f"{list(bias.shape)}"
        )


def _operands(weight: ExpertWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernel's weight pointer (rows of input features, or of their bytes) and scales."""
    if isinstance(weight, Mxfp4Weight):
        return weight.blocks.flatten(-2).contiguous(), weight.scales.contiguous()
    return (weight if weight.stride(-1) == 1 else weight.contiguous()), None


def moe_gemm(
    a: torch.Tensor,
    weight: ExpertWeight,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor,
    tile: MoeTile,
    *,
    a_row_div: int,
    gated: bool,
    activation: int,
    weighted: bool,
) -> None:
    """One grouped GEMM of ``fused_moe`` into ``out`` ``[T * K, N]`` (``moe_gemm_kernel``)."""
    sorted_slots, block_experts, padded_count = routing
    w, scales = _operands(weight)
    bias = None if bias is None else bias.contiguous()
    n = out.shape[1]
    k = a.shape[1]
    native = a.dtype == torch.float16 or (a.dtype == torch.bfloat16 and a.is_cuda)
    grid = (block_experts.numel(), triton.cdiv(n, tile.block_n))
    moe_gemm_kernel[grid](
        a,
        w,
        w if scales is None else scales,
        a if bias is None else bias,
        out,
        topk_weights,
        sorted_slots,
        block_experts,
        padded_count,
        n,
        k,
        out.shape[0],
        a.stride(0),
        w.stride(0),
        w.stride(1),
        0 if scales is None else scales.stride(0),
        0 if scales is None else scales.stride(1),
        0 if bias is None else bias.stride(0),
        out.stride(0),
        A_ROW_DIV=a_row_div,
        GATED=gated,
        ACTIVATION=activation,
        WEIGHTED=weighted,
        HAS_BIAS=bias is not None,
        MXFP4=scales is not None,
        NATIVE_DOTS=native,
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )


def fused_moe(
    hidden: torch.Tensor,
    w13: ExpertWeight,
    w2: ExpertWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Activation = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    tile: MoeTile | None = None,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t])`` for each token, in
    ``hidden``'s dtype (float16, bfloat16 or float32) ``[T, H]``, where
    ``expert_e(x) = w2[e] @ act(w13[e, :I] @ x + b13[e, :I], w13[e, I:] @ x + b13[e, I:])
    + b2[e]``. ``w13`` ``[E, 2I, H]`` (gate rows, then up rows) and ``w2`` ``[E, H, I]``,
    dense in ``hidden``'s dtype or ``Mxfp4Weight`` (``K`` a multiple of 32);
    ``topk_weights`` float32 and ``topk_ids`` int32 ``[T, K]``, ids in ``0 .. E - 1``;
    activation ``"silu"`` (``silu(gate) * up``) or ``"swigluoai"`` (gpt-oss's: gate clamped
    above at 7, up to ±7, ``(up + 1) * gate * sigmoid(1.702 * gate)``). ``tile`` overrides
    the config files' choice (``fused_moe_config``). Under tensor parallelism the result is
    this rank's partial sum (module docstring)."""
    if hidden.dim() != 2 or hidden.dtype not in DTYPES:
        raise ValueError(
            f"hidden must be a [T, H] float16, bfloat16 or float32 tensor, got {hidden.dtype} "
            f"{list(hidden.shape)}"
        )
    tokens, hidden_size = hidden.shape
    experts, twice_inter, h13 = _expert_shape("w13", w13, hidden.dtype)
    e2, h2, inter = _expert_shape("w2", w2, hidden.dtype)
    if h13 != hidden_size or twice_inter != 2 * inter or (e2, h2) != (experts, hidden_size):
        raise ValueError(
            f"w13 must be [E, 2I, {hidden_size}] and w2 [E, {hidden_size}, I] for hidden "
            f"[{tokens}, {hidden_size}], got {[experts, twice_inter, h13]} and {[e2, h2, inter]}"
        )
    if topk_ids.dtype != torch.int32 or topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(
            f"topk_ids must be int32 [{tokens}, K], got {topk_ids.dtype} {list(topk_ids.shape)}"
        )
    top_k = topk_ids.shape[1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"topk_ids' K must be in 1 .. {experts} (E), got {top_k}")
    if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights must be float32 [{tokens}, {top_k}], got {topk_weights.dtype} "
            f"{list(topk_weights.shape)}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    _check_bias("w13_bias", w13_bias, (experts, 2 * inter))
    _check_bias("w2_bias", w2_bias, (experts, hidden_size))
    if tokens == 0:
        return hidden.new_zeros((0, hidden_size))
    if tile is None:
        device = torch.cuda.get_device_name(hidden.device) if hidden.is_cuda else "cpu"
        formats = weight_format(w13)
        tile = pick_tile(tokens, top_k, experts, hidden_size, inter, formats, device)
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    routing = moe_align(topk_ids, experts, tile.block_m)
    weights = topk_weights.flatten().contiguous()
    slots = tokens * top_k
    intermediate = hidden.new_empty((slots, inter))
    moe_gemm(
        hidden,
        w13,
        w13_bias,
        intermediate,
        routing,
        weights,
        tile,
        a_row_div=top_k,
        gated=True,
        activation=ACTIVATIONS[activation],
        weighted=False,
    )
    down = hidden.new_empty((slots, hidden_size), dtype=torch.float32)
    moe_gemm(
        intermediate,
        w2,
        w2_bias,
        down,
        routing,
        weights,
        tile,
        a_row_div=1,
        gated=False,
        activation=0,
        weighted=True,
    )
    return down.view(tokens, top_k, hidden_size).sum(1).to(hidden.dtype)
