"""The causal depthwise convolution with SiLU in Triton (``causal_conv1d_torch``'s math and
state layout): ``causal_conv1d`` over a flat ragged batch (prefill), ``causal_conv1d_step``
for one token per sequence (decode). One program per (sequence, block of ``BLOCK_C``
channels) walks the sequence's tokens ``BLOCK_T`` at a time; a tap that falls before the
sequence's first token reads the slot's convolution state instead (zeros without a prior
state); the slot's new state is read before it is written, by the same program.
"""

import torch
import triton
import triton.language as tl

BLOCK_C = 64
BLOCK_T = 16


@triton.jit
def causal_conv1d_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    state_ptr,
    cu_seqlens_ptr,
    slots_ptr,
    has_state_ptr,
    channels,
    stride_xt,
    stride_ot,
    stride_slot,
    ONE_TOKEN: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Program ``(sequence, channel block)``; with ``ONE_TOKEN`` sequence ``i`` is row ``i``
    (no ``cu_seqlens``)."""
    seq = tl.program_id(0)
    if ONE_TOKEN:
        start = seq
        end = seq + 1
    else:
        start = tl.load(cu_seqlens_ptr + seq)
        end = tl.load(cu_seqlens_ptr + seq + 1)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cs < channels
    has_state = tl.load(has_state_ptr + seq) != 0
    state_from = tl.where(has_state, start - (WIDTH - 1), start)  # taps before: zeros
    state = state_ptr + tl.load(slots_ptr + seq).to(tl.int64) * stride_slot + cs * (WIDTH - 1)
    ts = tl.arange(0, BLOCK_T)
    for t0 in range(start, end, BLOCK_T):
        rows = t0 + ts
        row_mask = rows < end
        acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
        for j in tl.static_range(WIDTH):
            src = rows - (WIDTH - 1 - j)
            mask = row_mask[:, None] & c_mask[None, :]
            tap = tl.load(
                x_ptr + src[:, None].to(tl.int64) * stride_xt + cs[None, :],
                mask=mask & (src >= start)[:, None],
                other=0.0,
            ).to(tl.float32)
            tap += tl.load(
                state[None, :] + (WIDTH - 1 + src - start)[:, None],
                mask=mask & ((src < start) & (src >= state_from))[:, None],
                other=0.0,
            ).to(tl.float32)
            acc += (
                tap
                * tl.load(weight_ptr + cs * WIDTH + j, mask=c_mask, other=0.0).to(tl.float32)[
                    None, :
                ]
            )
        tl.store(
            out_ptr + rows[:, None].to(tl.int64) * stride_ot + cs[None, :],
            (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & c_mask[None, :],
        )
    kept = tl.arange(0, BLOCK_S)
    src = end - (WIDTH - 1) + kept
    mask = (kept < WIDTH - 1)[:, None] & c_mask[None, :]
    new = tl.load(
        x_ptr + src[:, None].to(tl.int64) * stride_xt + cs[None, :],
        mask=mask & (src >= start)[:, None],
        other=0.0,
    )
    new += tl.load(
        state[None, :] + (WIDTH - 1 + src - start)[:, None],
        mask=mask & ((src < start) & (src >= state_from))[:, None],
        other=0.0,
    ).to(new.dtype)
    tl.store(state[None, :] + kept[:, None], new.to(state_ptr.dtype.element_ty), mask=mask)


def launch_constants(width: int, one_token: bool) -> dict[str, int | bool]:
    """The kernel's constants for a ``width``-tap convolution, decode (``one_token``) or
    prefill."""
    return {
        "ONE_TOKEN": one_token,
        "WIDTH": width,
        "BLOCK_S": triton.next_power_of_2(width - 1),
        "BLOCK_C": BLOCK_C,
        "BLOCK_T": BLOCK_T,
    }


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    channels, width = weight.shape
    if x.shape[1] != channels or x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError(
            f"x [T, {channels}] with unit channel stride and a contiguous weight [C, K] needed, "
            f"got x {list(x.shape)}"
        )
    if conv_state.shape[1:] != (channels, width - 1) or not conv_state[0].is_contiguous():
        raise ValueError(
            f"conv_state must be [slots, {channels}, {width - 1}], each slot contiguous; "
            f"got {list(conv_state.shape)}"
        )
    out = x.new_empty(x.shape)
    grid = (slots.shape[0], triton.cdiv(channels, BLOCK_C))
    causal_conv1d_kernel[grid](
        x,
        weight,
        out,
        conv_state,
        slots if cu_seqlens is None else cu_seqlens,
        slots,
        has_state,
        channels,
        x.stride(0),
        out.stride(0),
        conv_state.stride(0),
        **launch_constants(width, one_token=cu_seqlens is None),
    )
    return out


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Prefill (``causal_conv1d_torch.causal_conv1d``'s contract, ``cu_seqlens`` an int32
    device tensor)."""
    return _launch(x, weight, cu_seqlens, conv_state, slots, has_state)


def causal_conv1d_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Decode, one token per sequence (``causal_conv1d_torch.causal_conv1d_step``'s
    contract)."""
    return _launch(x, weight, None, conv_state, slots, has_state)
