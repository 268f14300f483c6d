"""The gated delta rule in Triton: ``chunked_delta_rule`` for prefill (a flat ragged batch,
chunks of ``CHUNK_SIZE`` tokens) and ``delta_rule_step`` for decode (one token per
sequence). Same math, arguments and state layout as ``delta_rule_torch`` (its docstring has
the recurrence and the chunk's WY/UT form).

One program per (sequence, value head, block of ``BLOCK_V`` value columns) holds its
``[Dk, BLOCK_V]`` slice of the state in registers, float32, from the sequence's slot (zeros
without a prior state) to the slot again at the end. Queries and keys are L2-normalised in
the kernel. The chunk's ``(I + A)⁻¹`` (``A`` strictly lower triangular, so ``A^n = 0`` for a
chunk of ``n`` tokens) is the product ``(I - A)(I + A²)(I + A⁴)...``: ``2 log2(n)`` small
matmuls, no row-by-row substitution.

Dots take float32 operands as TF32 on the GPU (``DOTS``: 10-bit mantissas, about 1e-3
relative); Triton's interpreter computes them in float32, so the CPU tests do not see that
rounding. Compiled for sm_90 the chunked kernel
still spills registers at Qwen3.5's 128-wide heads (tests/test_triton_delta_rule_compile.py
records how much); it has not been timed on a GPU.
"""

import torch
import triton
import triton.language as tl

CHUNK_SIZE = 64
BLOCK_V = 32
CHUNK_WARPS = 8  # 4 spill twice as much at 128-wide heads
STEP_WARPS = 4
L2_EPS = tl.constexpr(1e-6)
DOTS = tl.constexpr("tf32")


@triton.jit
def _normalized(ptr, rows, row_mask, stride_t, head_offset, ks, k_mask, scale):
    """Rows ``rows`` of one head, ``[len(rows), BLOCK_K]`` float32, L2-normalised, times
    ``scale``."""
    x = tl.load(
        ptr + rows[:, None].to(tl.int64) * stride_t + head_offset + ks[None, :],
        mask=row_mask[:, None] & k_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    return x * (tl.rsqrt(tl.sum(x * x, 1) + L2_EPS) * scale)[:, None]


@triton.jit
def _slot_state(
    state_ptr, slots_ptr, has_state_ptr, seq, head, ks, vs, k_mask, v_mask, stride_slot, DK, DV
):
    """The program's ``[BLOCK_K, BLOCK_V]`` slice of the sequence's slot: its pointers, its
    mask, and its prior state in float32 (zeros where the sequence has none)."""
    slot_state = (
        state_ptr
        + tl.load(slots_ptr + seq).to(tl.int64) * stride_slot
        + head * DK * DV
        + ks[:, None] * DV
        + vs[None, :]
    )
    prior_rows = tl.where(tl.load(has_state_ptr + seq) != 0, DK, 0)
    prior_mask = (ks < prior_rows)[:, None] & v_mask[None, :]
    state = tl.load(slot_state, mask=prior_mask, other=0.0).to(tl.float32)
    return slot_state, k_mask[:, None] & v_mask[None, :], state


@triton.jit
def chunked_delta_rule_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    o_ptr,
    state_ptr,
    cu_seqlens_ptr,
    slots_ptr,
    has_state_ptr,
    scale,
    stride_qt,
    stride_kt,
    stride_vt,
    stride_gt,
    stride_ot,
    stride_slot,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Program ``(sequence, value head, value block)``: the sequence's chunks in order."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // GROUP
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    ts = tl.arange(0, BLOCK_T)
    k_mask, v_mask = ks < DK, vs < DV
    slot_state, state_mask, s = _slot_state(
        state_ptr, slots_ptr, has_state_ptr, seq, head, ks, vs, k_mask, v_mask, stride_slot, DK, DV
    )
    lower = ts[:, None] >= ts[None, :]
    strictly_lower = ts[:, None] > ts[None, :]
    identity = (ts[:, None] == ts[None, :]).to(tl.float32)
    for c0 in range(start, end, BLOCK_T):
        rows = c0 + ts
        row_mask = rows < end
        g = tl.load(g_ptr + rows.to(tl.int64) * stride_gt + head, mask=row_mask, other=0.0)
        beta = tl.load(beta_ptr + rows.to(tl.int64) * stride_gt + head, mask=row_mask, other=0.0)
        cum = tl.cumsum(g.to(tl.float32), 0)
        # (I + A)^-1 first, from the keys alone: little else is live through its loop
        k = _normalized(k_ptr, rows, row_mask, stride_kt, key_head * DK, ks, k_mask, 1.0)
        decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], float("-inf")))
        kk = tl.dot(k, tl.trans(k), input_precision=DOTS)
        power = tl.where(strictly_lower, -kk * beta.to(tl.float32)[:, None] * decay, 0.0)
        inverse = identity + power
        covered = 2  # inverse = sum of power^j, j < covered; power^(chunk's tokens) = 0
        while covered < end - c0:
            power = tl.dot(power, power, input_precision=DOTS)
            inverse += tl.dot(inverse, power, input_precision=DOTS)
            covered *= 2
        k = _normalized(k_ptr, rows, row_mask, stride_kt, key_head * DK, ks, k_mask, 1.0)
        v = tl.load(
            v_ptr + rows[:, None].to(tl.int64) * stride_vt + head * DV + vs[None, :],
            mask=row_mask[:, None] & v_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        u = tl.dot(inverse, v * beta[:, None], input_precision=DOTS)
        w = tl.dot(inverse, k * (beta * tl.exp(cum))[:, None], input_precision=DOTS)
        v_new = u - tl.dot(w, s, input_precision=DOTS)
        q = _normalized(q_ptr, rows, row_mask, stride_qt, key_head * DK, ks, k_mask, scale)
        decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], float("-inf")))
        qk = tl.where(lower, tl.dot(q, tl.trans(k), input_precision=DOTS) * decay, 0.0)
        o = tl.dot(q * tl.exp(cum)[:, None], s, input_precision=DOTS)
        o += tl.dot(qk, v_new, input_precision=DOTS)
        tl.store(
            o_ptr + rows[:, None].to(tl.int64) * stride_ot + head * DV + vs[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=row_mask[:, None] & v_mask[None, :],
        )
        last = tl.sum(g.to(tl.float32), 0)  # padded rows have g = 0
        k_decayed = k * tl.exp(last - cum)[:, None]
        s = s * tl.exp(last) + tl.dot(tl.trans(k_decayed), v_new, input_precision=DOTS)
    tl.store(slot_state, s.to(state_ptr.dtype.element_ty), mask=state_mask)


@triton.jit
def delta_rule_step_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    o_ptr,
    state_ptr,
    slots_ptr,
    has_state_ptr,
    scale,
    stride_qt,
    stride_kt,
    stride_vt,
    stride_gt,
    stride_ot,
    stride_slot,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program ``(sequence, value head, value block)``: one token's update and read."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // GROUP
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask, v_mask = ks < DK, vs < DV
    slot_state, state_mask, s = _slot_state(
        state_ptr, slots_ptr, has_state_ptr, seq, head, ks, vs, k_mask, v_mask, stride_slot, DK, DV
    )
    row = tl.full([1], 0, tl.int32) + seq
    row_mask = row >= 0
    q = tl.sum(_normalized(q_ptr, row, row_mask, stride_qt, key_head * DK, ks, k_mask, scale), 0)
    k = tl.sum(_normalized(k_ptr, row, row_mask, stride_kt, key_head * DK, ks, k_mask, 1.0), 0)
    v = tl.load(v_ptr + seq.to(tl.int64) * stride_vt + head * DV + vs, mask=v_mask, other=0.0)
    g = tl.load(g_ptr + seq.to(tl.int64) * stride_gt + head).to(tl.float32)
    beta = tl.load(beta_ptr + seq.to(tl.int64) * stride_gt + head).to(tl.float32)
    s = s * tl.exp(g)
    delta = (v.to(tl.float32) - tl.sum(s * k[:, None], 0)) * beta
    s += k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], 0)
    tl.store(
        o_ptr + seq.to(tl.int64) * stride_ot + head * DV + vs,
        o.to(o_ptr.dtype.element_ty),
        mask=v_mask,
    )
    tl.store(slot_state, s.to(state_ptr.dtype.element_ty), mask=state_mask)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> None:
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1:]
    if k.shape != q.shape or v.shape[0] != tokens or hv % hk:
        raise ValueError(
            f"q, k [T, Hk, Dk] and v [T, Hv, Dv] with Hk dividing Hv; got {list(q.shape)}, "
            f"{list(k.shape)}, {list(v.shape)}"
        )
    if g.shape != (tokens, hv) or beta.shape != g.shape or g.stride() != beta.stride():
        raise ValueError(
            f"g and beta must be [{tokens}, {hv}] alike, got {list(g.shape)}, {list(beta.shape)}"
        )
    if state.shape[1:] != (hv, dk, dv) or not state[0].is_contiguous():
        raise ValueError(
            f"state must be [slots, {hv}, {dk}, {dv}], each slot contiguous; "
            f"got {list(state.shape)}"
        )
    for x in (q, k, v):
        if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
            raise ValueError("q, k and v need contiguous heads (rows any stride apart)")
    if g.stride(1) != 1:
        raise ValueError("g and beta need a unit stride along heads")


def launch_constants(q: torch.Tensor, v: torch.Tensor) -> dict[str, int]:
    """Both kernels' shape constants for ``q`` ``[T, Hk, Dk]`` and ``v`` ``[T, Hv, Dv]``."""
    return {
        "GROUP": v.shape[1] // q.shape[1],
        "DK": q.shape[2],
        "DV": v.shape[2],
        "BLOCK_K": max(16, triton.next_power_of_2(q.shape[2])),
        "BLOCK_V": min(BLOCK_V, max(16, triton.next_power_of_2(v.shape[2]))),
    }


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Prefill over a flat ragged batch (``delta_rule_torch.gated_delta_rule_chunked``'s
    contract, ``cu_seqlens`` an int32 device tensor): returns ``o`` ``[T, Hv, Dv]`` in
    ``v``'s dtype and leaves each sequence's final state in ``state[slots[i]]``."""
    _check(q, k, v, g, beta, state)
    out = v.new_empty(v.shape)
    dims = launch_constants(q, v)
    grid = (slots.shape[0], v.shape[1], triton.cdiv(v.shape[2], dims["BLOCK_V"]))
    chunked_delta_rule_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        out,
        state,
        cu_seqlens,
        slots,
        has_state,
        q.shape[2] ** -0.5,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        g.stride(0),
        out.stride(0),
        state.stride(0),
        BLOCK_T=CHUNK_SIZE,
        num_warps=CHUNK_WARPS,
        **dims,
    )
    return out


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Decode, one token per sequence (``delta_rule_torch.gated_delta_rule_step``'s
    contract): returns ``o`` ``[B, Hv, Dv]`` and updates ``state[slots]`` in place."""
    _check(q, k, v, g, beta, state)
    out = v.new_empty(v.shape)
    dims = launch_constants(q, v)
    grid = (slots.shape[0], v.shape[1], triton.cdiv(v.shape[2], dims["BLOCK_V"]))
    delta_rule_step_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        out,
        state,
        slots,
        has_state,
        q.shape[2] ** -0.5,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        g.stride(0),
        out.stride(0),
        state.stride(0),
        num_warps=STEP_WARPS,
        **dims,
    )
    return out
