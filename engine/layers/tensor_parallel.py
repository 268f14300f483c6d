"""The tensor-parallel group a model's layers are sharded over.

A model is built for one rank of a group of ``size`` ranks: each sharded layer holds its
``rank``'s part of the weights and calls ``all_reduce`` / ``all_gather`` where Megatron's
layout needs them (after a row-parallel linear; the vocabulary-parallel LM head's logits).
With ``size == 1`` (``TensorParallel()``) both are the identity and no process group exists:
a model on one device runs exactly as an unsharded one. Only the executor makes a group of
more than one rank (``torch.distributed``: gloo on a CPU, NCCL on CUDA); layers and models
read this object and never ask torch.distributed themselves.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None
    """The ``torch.distributed`` process group of the ranks; None when ``size == 1``."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in a group of {self.size}")
        if self.size > 1 and self.group is None:
            raise ValueError("a group of more than one rank needs its process group")

    def kv_heads(self, num_kv_heads: int) -> int:
        """The kv heads each rank holds: its share when ``size`` divides them, else one
        (replicated: ``num_kv_heads`` must then divide ``size``, each head held by
        ``size // num_kv_heads`` ranks, those whose query heads use it)."""
        if num_kv_heads % self.size == 0:
            return num_kv_heads // self.size
        if self.size % num_kv_heads == 0:
            return 1
        raise ValueError(
            f"{num_kv_heads} kv heads cannot be split over {self.size} ranks: use a "
            "tensor-parallel size that divides them or that they divide"
        )

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks, in place."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
