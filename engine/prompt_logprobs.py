"""Prompt log-probabilities (``prompt_logprobs``): each prompt position's, from the logits of
the step that computed it, built on the device (``prompt_tables``) and read after the step's
one copy to the host (``record_prompt_logprobs``)."""

import logging
from dataclasses import dataclass, field

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device
from kvserve.engine.sampler import logprob_table, read_logprobs

log = logging.getLogger(__name__)


@dataclass
class PromptTables:
    """A step's spans still to record (one recomputed after a preemption was recorded
    before), each with its ``logprob_table`` on the device; the requests whose table
    raised."""

    spans: list[tuple[Request, range]] = field(default_factory=list)
    tables: list[torch.Tensor] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)


def prompt_tables(spans: list[tuple[Request, range]], logits: torch.Tensor) -> PromptTables:
    """The tables of ``spans`` (``SchedulerOutput.prompt_logprob_spans``) from ``logits``,
    their rows in order."""
    found, row = PromptTables(), 0
    for request, span in spans:
        rows = logits[row : row + len(span)]
        row += len(span)
        if len(request.prompt_logprobs) != span.start + 1:
            continue  # recomputed after a preemption: already recorded
        try:
            targets = request.prompt_token_ids[span.start + 1 : span.stop + 1]
            target_ids = to_device(targets, logits.device, torch.long)
            table = logprob_table(rows, target_ids, request.params.prompt_logprobs or 0)
        except Exception:
            log.exception("prompt logprobs of request %s failed", request.request_id)
            found.failed.append(request)
            continue
        found.spans.append((request, span))
        found.tables.append(table)
    return found


def record_prompt_logprobs(found: PromptTables, host: list[list[list[float]]]) -> list[Request]:
    """Append each span's prompt logprobs from its table on the host (``host``, in the order
    of ``found.tables``); the requests for which building or reading it raised."""
    failed = list(found.failed)
    for (request, span), table in zip(found.spans, host, strict=True):
        try:
            num_top = [request.params.prompt_logprobs or 0] * len(span)
            request.prompt_logprobs.extend(read_logprobs(table, num_top))
        except Exception:
            log.exception("prompt logprobs of request %s failed", request.request_id)
            failed.append(request)
    return failed
