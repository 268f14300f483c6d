"""Per-sequence recurrent state kept in slots: a state tensor ``[num_slots, ...]`` holds one
sequence's state per slot; a batch names its sequences' slots and whether each has a prior
state (a sequence with none starts from zeros)."""

import torch


def initial_states(
    state: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor
) -> torch.Tensor:
    """float32 ``[B, ...]``: ``state[slots[i]]`` where ``has_state[i]``, zeros elsewhere
    (whatever the slot held, NaN included)."""
    prior = state[slots.long()].float()
    return torch.where(has_state.view(-1, *([1] * (state.dim() - 1))), prior, 0.0)
