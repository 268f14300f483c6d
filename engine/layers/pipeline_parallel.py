"""The pipeline stage a model's layers are split by.

A world of ``tp x pp`` ranks runs ``pp`` stages of contiguous layers; world rank ``r`` is
tensor-parallel rank ``r % tp`` of stage ``r // tp``. The first stage embeds the tokens, the
last holds the final norm and the LM head; between stages each rank sends the residual
stream (hidden states and residual, ``[tokens, hidden_size]`` each) to the rank of the same
tensor-parallel index in the next stage, and the last stage's rank 0 sends the logits back
to world rank 0 (where the sampler is). With ``size == 1`` (``PipelineParallel()``) the
model is whole and nothing is sent. Only the executor makes a stage of a larger pipeline.
"""

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

LOGITS_TAG = 1


@dataclass
class PipelineParallel:
    rank: int = 0
    """This rank's stage."""
    size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    group: Any = None
    """The world's process group (every rank of every stage); None when ``size == 1``."""
    timeout: timedelta | None = None
    """How long a send or receive waits for its peer (None: the group's own bound)."""

    @classmethod
    def of_rank(cls, rank: int, tp_size: int, pp_size: int) -> "PipelineParallel":
        return cls(rank // tp_size, pp_size, rank % tp_size, tp_size)

    def joined(self, group: Any) -> "PipelineParallel":
        """This stage with its world group (kept None for one stage)."""
        return dataclasses.replace(self, group=group if self.size > 1 else None)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def layers(self, num_layers: int) -> range:
        """This stage's layers: ``num_layers // size`` each, the remainder one more each on
        the stages just before the last (the last also runs the LM head)."""
        if num_layers < self.size:
            raise ValueError(
                f"pipeline_parallel_size {self.size} is more than the model's {num_layers} layers"
            )
        counts = [num_layers // self.size] * self.size
        for i in range(num_layers % self.size):
            counts[-2 - i] += 1
        start = sum(counts[: self.rank])
        return range(start, start + counts[self.rank])

    def _world_rank(self, stage: int) -> int:
        return stage * self.tp_size + self.tp_rank

    def _wait(self, work: Any) -> None:
        if self.timeout is None:
            work.wait()
        else:
            work.wait(self.timeout)

    def send_next(self, *tensors: torch.Tensor, pending: list[Any] | None = None) -> None:
        """``tensors`` to this rank's peer in the next stage; sent once this returns, or, with
        ``pending``, in flight: each send's (work, tensor) appended there, for ``wait_all``."""
        peer = self._world_rank(self.rank + 1)
        for tensor in tensors:
            tensor = tensor.contiguous()
            work = self.group.send([tensor], peer, 0)
            if pending is None:
                self._wait(work)
            else:
                pending.append((work, tensor))

    def wait_all(self, pending: list[Any]) -> None:
        """The sends in flight in ``pending`` done."""
        for work, _ in pending:
            self._wait(work)

    def recv_prev(self, count: int, like: torch.Tensor) -> list[torch.Tensor]:
        """``count`` tensors shaped as ``like`` from this rank's peer in the previous stage."""
        peer = self._world_rank(self.rank - 1)
        out = [torch.empty_like(like) for _ in range(count)]
        for tensor in out:
            self._wait(self.group.recv([tensor], peer, 0))
        return out

    @property
    def sends_logits(self) -> bool:
        """The last stage's first rank returns the logits to world rank 0."""
        return self.size > 1 and self.is_last and self.tp_rank == 0

    def send_logits(self, logits: torch.Tensor) -> None:
        self._wait(self.group.send([logits.contiguous()], 0, LOGITS_TAG))

    def recv_logits(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        logits = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        self._wait(self.group.recv([logits], self._world_rank(self.size - 1), LOGITS_TAG))
        return logits
