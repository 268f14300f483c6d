"""The sampler's logit adjustments as they were computed before the history moved to the
device: counts and seen tokens rebuilt every call from the requests' token lists on the host
(which are only exact with synchronous steps). The oracle the device history is held to."""

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.sampler import Sampler
from kvserve.engine.sampling_state import StepRows


def _index(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    row_ids = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor([len(r) for r in rows]))
    return row_ids, torch.tensor([c for r in rows for c in r], dtype=torch.long)


def host_list_logits(logits: torch.Tensor, requests: list[Request], eos: tuple[int, ...]):
    """Logit bias, presence/frequency/repetition penalties and the ``min_tokens`` ban, from
    ``r.output_token_ids`` and ``r.all_token_ids`` (no grammar)."""
    params = [r.params for r in requests]
    if any(p.logit_bias for p in params):
        index = _index([list(p.logit_bias) for p in params])
        bias = torch.tensor([v for p in params for v in p.logit_bias.values()], dtype=logits.dtype)
        logits = logits.index_put(index, bias, accumulate=True)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        rows, cols = _index([r.output_token_ids for r in requests])
        counts = torch.zeros_like(logits).index_put_(
            (rows, cols), torch.ones_like(cols, dtype=logits.dtype), accumulate=True
        )
        frequency = torch.tensor([p.frequency_penalty for p in params])
        presence = torch.tensor([p.presence_penalty for p in params])
        logits = logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    if any(p.repetition_penalty != 1 for p in params):
        rows, cols = _index([r.all_token_ids for r in requests])
        seen = torch.zeros_like(logits, dtype=torch.bool).index_put_(
            (rows, cols), torch.ones_like(cols, dtype=torch.bool)
        )
        penalty = torch.tensor([p.repetition_penalty for p in params])[:, None]
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    banned = [
        [*eos, *r.params.stop_token_ids] if r.num_output_tokens < r.params.min_tokens else []
        for r in requests
    ]
    if any(banned):
        logits = logits.index_put(_index(banned), torch.tensor(-torch.inf))
    return logits


class HostListSampler(Sampler):
    """The engine's sampler with ``host_list_logits`` in place of the device history: run
    with synchronous steps, it samples what the sampler did before."""

    def adjust_logits(
        self, logits: torch.Tensor, requests: list[Request], rows: StepRows | None = None
    ) -> torch.Tensor:
        return host_list_logits(logits, requests, self.eos_token_ids)
