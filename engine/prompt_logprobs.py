"""Prompt log-probabilities (``prompt_logprobs``): each prompt position's, recorded from the
logits of the step that computed it."""

import logging

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device
from kvserve.engine.sampler import logprobs_of

log = logging.getLogger(__name__)


def record_prompt_logprobs(
    spans: list[tuple[Request, range]], logits: torch.Tensor
) -> list[Request]:
    """Append each span's prompt logprobs; returns the requests for which that raised."""
    row, failed = 0, []
    for request, span in spans:
        rows = logits[row : row + len(span)]
        row += len(span)
        if len(request.prompt_logprobs) != span.start + 1:
            continue  # recomputed after a preemption: already recorded
        try:
            targets = request.prompt_token_ids[span.start + 1 : span.stop + 1]
            target_ids = to_device(targets, logits.device, torch.long)
            num_top = [request.params.prompt_logprobs or 0] * len(span)
            request.prompt_logprobs.extend(logprobs_of(rows, target_ids, num_top))
        except Exception:
            log.exception("prompt logprobs of request %s failed", request.request_id)
            failed.append(request)
    return failed
