"""A pipeline step in micro-batches, so that the stages overlap: while stage 1 runs the
first micro-batch, stage 0 runs the second.

A step's requests are cut in contiguous runs of about equal tokens (one per stage, as many
as there are requests at most); each run is a ``SchedulerOutput`` of its own, prepared and
sent as a step of its own. The logits of the whole step are the runs' sampling rows in
order, then their prompt-logprob rows in order: the layout of one step's logits.
"""

from collections.abc import Sequence

import torch

from kvserve.engine.core.scheduler import SchedulerOutput


def split(out: SchedulerOutput, count: int) -> list[SchedulerOutput]:
    """``out`` as at most ``count`` micro-batches of contiguous requests, about equal in
    tokens, none empty."""
    count = min(count, len(out.scheduled))
    total, done = out.num_batched_tokens, 0
    parts: list[SchedulerOutput] = []
    current = SchedulerOutput()
    for index, (request, num_new) in enumerate(out.scheduled):
        current.scheduled.append((request, num_new))
        done += num_new
        left = len(out.scheduled) - index - 1
        due = done * count >= total * (len(parts) + 1) or left == count - len(parts) - 1
        if due and len(parts) < count - 1 and left:
            parts.append(current)
            current = SchedulerOutput()
    parts.append(current)
    for part in parts:
        ids = {id(r) for r, _ in part.scheduled}
        part.sampling_requests = [r for r in out.sampling_requests if id(r) in ids]
        part.prompt_logprob_spans = [s for s in out.prompt_logprob_spans if id(s[0]) in ids]
        part.spec_token_ids = {
            r.request_id: out.spec_token_ids[r.request_id]
            for r, _ in part.scheduled
            if r.request_id in out.spec_token_ids
        }
    return parts


def join_logits(parts: Sequence[SchedulerOutput], logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """The step's logits from each micro-batch's: every sampling row (and draft row) first,
    in order."""
    sampling = [x[: p.num_sampling_rows] for p, x in zip(parts, logits, strict=True)]
    spans = [x[p.num_sampling_rows :] for p, x in zip(parts, logits, strict=True)]
    return torch.cat(sampling + spans)
