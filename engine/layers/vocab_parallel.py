"""The vocabulary split over the ranks: the input embedding and the LM head.

Rank r holds rows ``[r * per_rank, (r + 1) * per_rank)`` of the vocabulary, ``per_rank =
ceil(vocab / size)``; rows past the vocabulary (the last ranks' padding, when ``size`` does
not divide it) are zeros. The embedding looks up the ids in this rank's rows (other ids give
zeros) and sums over the ranks; the LM head computes this rank's logits, gathers every
rank's in rank order and trims the padding. With one rank both are the plain layers.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers.linear import LinearBase, LinearMethod, read, set_weight_loader
from kvserve.engine.layers.tensor_parallel import TensorParallel


class VocabShard:
    """This rank's rows of a vocabulary of ``vocab_size`` split over ``tp``."""

    def __init__(self, vocab_size: int, tp: TensorParallel) -> None:
        self.vocab_size = vocab_size
        self.per_rank = cdiv(vocab_size, tp.size)
        self.start = min(tp.rank * self.per_rank, vocab_size)
        self.end = min(self.start + self.per_rank, vocab_size)

    def load(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """This rank's rows of the checkpoint's ``[vocab, hidden]`` tensor; zeros past it."""
        with torch.no_grad():
            rows = self.end - self.start
            if rows:
                param[:rows].copy_(read(loaded, 0, self.start, rows))
            param[rows:].zero_()


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.shard = VocabShard(vocab_size, tp)
        self.weight = nn.Parameter(
            torch.empty(self.shard.per_rank, hidden_size), requires_grad=False
        )
        set_weight_loader(self.weight, self.shard.load)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.shard.start) & (input_ids < self.shard.end)
        out = F.embedding((input_ids - self.shard.start) * mine, self.weight)
        out *= mine.unsqueeze(-1).to(out.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(LinearBase):
    """Hidden states → logits over the whole vocabulary (``[..., vocab_size]``), each rank
    computing its rows' (through its weight method, as any linear) and gathering the rest."""

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        tp: TensorParallel,
        method: LinearMethod | None = None,
    ) -> None:
        self.shard = VocabShard(vocab_size, tp)
        super().__init__(hidden_size, self.shard.per_rank, False, tp, method)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        self.shard.load(param, loaded)

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding's weight (the same rows on every rank)."""
        self.weight = embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.method.apply(self, x)
        if self.tp.size > 1:
            logits = self.tp.all_gather(logits)[..., : self.shard.vocab_size]
        return logits
