"""The causal depthwise convolution of a linear-attention layer, with SiLU, in torch ops.

Channel ``c`` of token ``t`` is ``silu(sum_j weight[c, j] * x[t - (K - 1) + j, c])`` over the
sequence's tokens, the positions before its first token read from its convolution state:
``conv_state[slot]`` ``[C, K - 1]`` holds the inputs of the ``K - 1`` tokens before (oldest
first), zeros when the sequence has no prior state. Afterwards the slot holds the inputs of
the sequence's last ``K - 1`` tokens (some from the old state when it got fewer new ones).
Sums in float32; outputs in ``x``'s dtype.
"""

import itertools

import torch
import torch.nn.functional as F

from kvserve.engine.kernels.slot_states import initial_states


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: list[int],
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Prefill over a flat ragged batch: ``x`` ``[T, C]``, sequence ``i`` rows
    ``cu_seqlens[i]:cu_seqlens[i + 1]``; ``weight`` ``[C, K]``; ``conv_state``
    ``[num_slots, C, K - 1]``. Returns ``[T, C]`` and updates ``conv_state[slots]``."""
    channels, width = weight.shape
    prior = initial_states(conv_state, slots, has_state)
    out = torch.empty_like(x)
    finals = []
    for i, (start, end) in enumerate(itertools.pairwise(cu_seqlens)):
        padded = torch.cat([prior[i], x[start:end].t().float()], dim=1)
        y = F.conv1d(padded[None], weight.float()[:, None, :], groups=channels)[0]
        out[start:end] = F.silu(y).t().to(x.dtype)
        finals.append(padded[:, padded.shape[1] - (width - 1) :])
    if finals:
        conv_state[slots.long()] = torch.stack(finals).to(conv_state.dtype)
    return out


def causal_conv1d_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """Decode, one token per sequence: ``x`` ``[B, C]``. Returns ``[B, C]`` and shifts the
    token into ``conv_state[slots]``."""
    window = torch.cat([initial_states(conv_state, slots, has_state), x.float()[..., None]], -1)
    conv_state[slots.long()] = window[..., 1:].to(conv_state.dtype)
    return F.silu((window * weight.float()).sum(-1)).to(x.dtype)
