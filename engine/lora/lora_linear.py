"""A linear layer with batched LoRA: the base output plus, for the rows of each adapter in
the batch, ``B[slot] @ (A[slot] @ x)``.

The adapters resident on the device sit in slots ``0 .. max_loras - 1`` of stacked tensors,
padded to ``max_lora_rank`` with zeros (a zero row of A and column of B add nothing):
A ``[max_loras, parts * max_rank, in]`` holds the parts of a fused projection (q/k/v,
gate/up) one under the other, so one shrink matmul serves them all; B
``[max_loras, out, parts * max_rank]`` is block-diagonal: part i's rows (its output
features) are nonzero only in part i's rank columns, so one expand matmul serves them all
too (on a CPU one matmul of inner size 48 is many times faster than three of 16 and a
concatenation, though it multiplies zeros). The
step's rows are grouped by slot once per step (``LoRABatch``). On a CPU each layer then runs
one shrink and one expand per adapter present: a loop over the batch's adapters, never over
its requests. On a GPU (``LoRABatch.segments`` set) each layer launches the Triton shrink and
expand once for all of them (``kernels/triton_lora.py``; its expand reads only B's diagonal
blocks). Rows of the base model are in no group and get nothing added.

Sharding follows the base layer's: a column-parallel layer holds B's rows of its output
features (A whole); a row-parallel one holds A's columns of its input features, and its
partial product, added before the layer's all-reduce, is summed with the others by it.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from kvserve.engine.kernels.lora_segments import LoRASegments
from kvserve.engine.layers.linear import LinearBase, RowParallelLinear


@dataclass
class LoRABatch:
    """The step's rows grouped by adapter slot, set by the runner before each forward:
    for the torch path ``groups`` holds (slot, row indices; None when the slot has every
    row); for the Triton kernels ``segments`` holds them all (``groups`` then empty). Both
    empty when no row runs an adapter."""

    groups: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)
    segments: LoRASegments | None = None


class LoRALinear(nn.Module):
    """``base`` (a ``LinearBase``) with LoRA slots; ``parts``: (output offset, output
    features) of each part of a fused projection on this rank, in A's order."""

    def __init__(
        self,
        base: LinearBase,
        parts: list[tuple[int, int]],
        max_loras: int,
        max_rank: int,
        batch: LoRABatch,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.base, self.parts, self.max_rank, self.batch = base, parts, max_rank, batch
        self.reduce = isinstance(base, RowParallelLinear) and base.reduce_results
        if isinstance(base, RowParallelLinear):
            base.reduce_results = False  # the sum of base and LoRA partials is reduced here
        dtype = base.compute_dtype
        shape_a = (max_loras, len(parts) * max_rank, base.in_features)
        self.lora_a = torch.zeros(shape_a, dtype=dtype, device=device)
        shape_b = (max_loras, base.out_features, len(parts) * max_rank)
        self.lora_b = torch.zeros(shape_b, dtype=dtype, device=device)
        self.part_offsets = torch.tensor([o for o, _ in parts], dtype=torch.int32, device=device)
        self.part_sizes = torch.tensor([s for _, s in parts], dtype=torch.int32, device=device)
        self.max_size = max(size for _, size in parts)

    def set_slot(self, slot: int, pairs: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Fill ``slot`` with this rank's (A, B) of each part (None: the adapter leaves the
        part alone); the rest of the slot is zeroed."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        r = self.max_rank
        for index, ((offset, size), pair) in enumerate(zip(self.parts, pairs, strict=True)):
            if pair is None:
                continue
            a, b = pair
            rank = a.shape[0]
            self.lora_a[slot, index * r : index * r + rank] = a
            self.lora_b[slot, offset : offset + size, index * r : index * r + rank] = b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.batch.segments is not None:
            from kvserve.engine.kernels.triton_lora import lora_expand, lora_shrink

            segments, rank = self.batch.segments, self.max_rank
            shrunk = lora_shrink(x.contiguous(), self.lora_a, segments, len(self.parts), rank)
            offsets, sizes = self.part_offsets, self.part_sizes
            lora_expand(out, shrunk, self.lora_b, segments, offsets, sizes, self.max_size, rank)
        for slot, rows in self.batch.groups:
            shrunk = (x if rows is None else x.index_select(0, rows)) @ self.lora_a[slot].T
            delta = shrunk @ self.lora_b[slot].T
            if rows is None:
                out += delta
            else:  # on a CPU many times faster than index_add_ in bfloat16
                out.index_put_((rows,), delta, accumulate=True)
        if self.reduce:
            self.base.tp.all_reduce(out)
        return out
