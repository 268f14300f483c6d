"""A step's rows grouped by LoRA slot, as the batched LoRA kernels read them."""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class LoRASegments:
    """``rows``: the indices of the rows that run an adapter, sorted by slot (stable, so
    ascending within a slot); group ``g`` is ``rows[starts[g] : starts[g] + lengths[g]]``,
    all of slot ``slots[g]``. Rows of the base model are in no group. ``max_length`` (the
    longest group, known on the host) sizes the kernels' grids without a device sync.
    All four tensors are int32 on the device."""

    rows: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    slots: torch.Tensor
    max_length: int

    @property
    def num_groups(self) -> int:
        return self.slots.shape[0]


def lora_segments(row_slots: np.ndarray, device: torch.device) -> LoRASegments | None:
    """``row_slots[i]``: row i's slot, -1 for the base model → its groups (one host to
    device copy); None when no row runs an adapter."""
    order = np.argsort(row_slots, kind="stable")
    order = order[row_slots[order] >= 0]
    if len(order) == 0:
        return None
    slots, starts, lengths = np.unique(row_slots[order], return_index=True, return_counts=True)
    packed = torch.from_numpy(np.concatenate([order, starts, lengths, slots]).astype(np.int32))
    rows, starts_t, lengths_t, slots_t = packed.to(device).split(
        [len(order), len(slots), len(slots), len(slots)]
    )
    return LoRASegments(rows, starts_t, lengths_t, slots_t, int(lengths.max()))
