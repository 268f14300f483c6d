"""Token routing for the fused MoE GEMMs: the ``T * K`` (token, choice) slots grouped by
expert, each expert's run padded to the GEMM's row block, so that every row block of the
grouped GEMM belongs to one expert.

Slot ``s = t * K + k`` is token ``t``'s ``k``-th choice, routed to expert ``topk_ids[t, k]``.
Everything is computed on the device with torch ops and no host sync: the outputs are sized
for the worst case, and the GEMM reads the padded count to skip the blocks past it.
"""

from typing import NamedTuple

import torch


class MoeAlignment(NamedTuple):
    """Invariants, with ``n = T * K`` slots and ``P = padded_count``:

    - ``sorted_slots`` int32 ``[capacity]``: expert 0's slots in ascending order, then
      padding up to a multiple of ``block_m``, then expert 1's, and so on; past ``P`` only
      padding. Padding is the sentinel ``n``. Each slot ``0 .. n - 1`` occurs exactly once.
    - ``block_experts`` int32 ``[capacity // block_m]``: the expert of row block ``b``
      (rows ``b * block_m .. (b + 1) * block_m - 1``), ``-1`` for the blocks past ``P``.
    - ``padded_count`` int32 ``[1]``: ``P``, the sum over experts of their slot counts
      rounded up to ``block_m``.
    """

    sorted_slots: torch.Tensor
    block_experts: torch.Tensor
    padded_count: torch.Tensor


def alignment_capacity(slots: int, num_experts: int, block_m: int) -> int:
    """Rows enough for any routing of ``slots`` slots, a multiple of ``block_m``: at most
    ``min(E, slots)`` experts get a slot, each padding by at most ``block_m - 1`` rows."""
    worst = slots + min(num_experts, slots) * (block_m - 1)
    return -(-worst // block_m) * block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """``topk_ids`` ``[T, K]`` (any integer dtype, values in ``0 .. num_experts - 1``) →
    the slots sorted by expert and padded per expert to ``block_m`` (``MoeAlignment``)."""
    if topk_ids.dim() != 2 or topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise ValueError(
            f"topk_ids must be an integer [T, K] tensor, got {topk_ids.dtype} "
            f"{list(topk_ids.shape)}"
        )
    if num_experts < 1 or block_m < 1:
        raise ValueError(f"num_experts and block_m must be positive, got {num_experts}, {block_m}")
    device = topk_ids.device
    experts = topk_ids.flatten().long()
    slots = experts.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    padded_starts = padded_ends - padded
    order = torch.argsort(experts, stable=True)
    sorted_experts = experts[order]
    rank = torch.arange(slots, device=device) - (counts.cumsum(0) - counts)[sorted_experts]
    capacity = alignment_capacity(slots, num_experts, block_m)
    sorted_slots = torch.full((capacity,), slots, dtype=torch.int32, device=device)
    sorted_slots[padded_starts[sorted_experts] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return MoeAlignment(
        sorted_slots, block_experts.to(torch.int32), padded_ends[-1:].to(torch.int32)
    )
