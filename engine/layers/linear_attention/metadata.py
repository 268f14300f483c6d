"""What a linear-attention layer needs to know about one flat step batch, and the shape of
the per-sequence state it keeps: the contract between these layers and the KV-cache
manager's state-slot group and the model runner."""

from dataclasses import dataclass

import torch

LinearAttentionCache = tuple[torch.Tensor, torch.Tensor]
"""One layer's ``(conv_state, ssm_state)`` on this rank, each ``[num_slots, *StateSpec's
shape]``: ``conv_state [num_slots, conv_dim / tp, kernel - 1]`` in the model's dtype (the
last ``kernel - 1`` inputs of the convolution, oldest first), ``ssm_state [num_slots,
v_heads / tp, head_k_dim, head_v_dim]`` in float32 (the delta rule's recurrent state: it
accumulates over the whole sequence, so it is not rounded to 16 bits between steps). Each
slot is contiguous."""


@dataclass(frozen=True)
class StateSpec:
    """One layer's state per sequence (per slot) on this rank: what the KV-cache manager
    allocates ``num_slots`` of."""

    conv_shape: tuple[int, int]
    ssm_shape: tuple[int, int, int]
    conv_dtype: torch.dtype
    ssm_dtype: torch.dtype = torch.float32

    @property
    def bytes_per_slot(self) -> int:
        conv = self.conv_shape[0] * self.conv_shape[1] * self.conv_dtype.itemsize
        ssm = self.ssm_shape[0] * self.ssm_shape[1] * self.ssm_shape[2] * self.ssm_dtype.itemsize
        return conv + ssm

    def allocate(self, num_slots: int, device: torch.device) -> LinearAttentionCache:
        """Zeroed ``(conv_state, ssm_state)`` for ``num_slots`` sequences (zeros are not
        needed for correctness: a sequence without a prior state never reads its slot)."""
        return (
            torch.zeros(num_slots, *self.conv_shape, dtype=self.conv_dtype, device=device),
            torch.zeros(num_slots, *self.ssm_shape, dtype=self.ssm_dtype, device=device),
        )


@dataclass
class StateMetadata:
    """Layout of one flat, unpadded step batch for the linear-attention layers.

    The batch concatenates the scheduled tokens of ``num_seqs`` sequences, in the order of
    ``AttentionMetadata`` (the same ``query_start_loc`` serves both): the tokens of sequence
    ``i`` are rows ``query_start_loc[i]:query_start_loc[i + 1]``, its next tokens in order.
    Its state lives in slot ``state_slots[i]`` of every linear-attention layer's
    ``conv_state`` and ``ssm_state``; a slot is held by one sequence from its admission to
    its finish or preemption, whatever its number of tokens (slots, not blocks).

    ``has_initial_state[i]`` is true exactly when the slot holds the state after the
    sequence's first ``num_computed_tokens`` tokens, i.e. when ``num_computed_tokens > 0``;
    false (a new sequence, or one readmitted after preemption by recompute) makes the layers
    start from zeros, whatever the slot holds, and overwrite it. Hence a prefix-cache hit
    cannot skip a linear-attention model's tokens (its state is not in the cached blocks):
    such a sequence must be scheduled from token 0.

    After the step, every slot holds the state after the sequence's scheduled tokens: a
    step's tokens must all be accepted (speculative tokens would need a state per
    position). A batch padded for a CUDA graph gives each padding sequence a slot no
    request holds (a scratch slot): the kernels write every listed slot. Device tensors feed
    the kernels; the host list (same values) lets the torch path split the batch without a
    device sync.
    """

    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    state_slots: torch.Tensor  # [num_seqs] int32
    has_initial_state: torch.Tensor  # [num_seqs] bool
    query_start_loc_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.query_start_loc_host) - 1

    @property
    def decode_only(self) -> bool:
        """One token per sequence: the recurrent step kernels serve the whole batch."""
        return self.query_start_loc_host[-1] == self.num_seqs
