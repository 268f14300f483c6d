"""Verification: the target model's tokens at a step's draft positions decide what stays.

A proposer's draft is a point mass q on one token x. The standard rule (accept x with
probability min(1, p(x)/q(x)) = p(x); else draw from norm(max(0, p - q)), which is p with x
left out) gives exactly the distribution of drawing t ~ p and accepting x iff t == x, and
keeping t either way. So each position draws its token with the engine's own sampler, as
if no draft existed (the request's penalties, logit bias, grammar mask and ``min_tokens``
ban over the tokens accepted so far; greedy rows the argmax; a seeded row one draw of its
generator per token), and the run goes on while the drawn token is the draft. Every token a
request outputs is thus the token it would have output without speculation: greedy and
seeded outputs are the same with and without it.

Requests whose token is the argmax of their raw row whatever they appended before
(``Sampler.takes_argmax``: plain greedy ones) skip that loop: one argmax over every row of
the step, one device → host copy, then each such request's longest matching prefix on the
host. The others (sampled, penalised, constrained, with logprobs) go position by position.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvserve.engine.core.outputs import Logprob
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.host_copy import to_host
from kvserve.engine.kernels.row_argmax import row_argmax
from kvserve.engine.sampler import Sampler

Sample = Callable[
    [torch.Tensor, list[Request]], tuple[dict[str, tuple[int, Logprob | None]], list[Request]]
]
"""The engine's ``_sample``: each request's token and logprob, and the requests whose
sampling raised."""


@dataclass
class Verified:
    """``num_rejected``: by request id, the drafts whose KV the step computed for nothing;
    ``failed``: the requests whose sampling raised (nothing more appended to them);
    ``runs``: (drafts, accepted) of each request that verified drafts."""

    num_rejected: dict[str, int]
    failed: list[Request]
    runs: list[tuple[int, int]]


def verify(
    logits: torch.Tensor,
    out: SchedulerOutput,
    sample: Sample,
    append: Callable[[Request, int], None],
) -> Verified:
    """Draw each sampling request's tokens from its logits rows (``logits``: the step's
    sampling rows, in ``out.sampling_requests`` order, a row per draft after each request's
    first), ``append``-ing each; a request stops at its first token that is not its draft,
    after its last draft's row (the bonus token), or when it finishes (nothing after its
    stop). Requests already finished (failed) are passed over."""
    first_row, row = {}, 0
    for request in out.sampling_requests:
        first_row[request.request_id] = row
        row += 1 + out.num_drafts(request)
    alive = [r for r in out.sampling_requests if not r.is_finished]
    num_rejected = {r.request_id: out.num_drafts(r) for r in alive}
    by_argmax = [r for r in alive if Sampler.takes_argmax(r)]
    if by_argmax:
        tokens = to_host(row_argmax(logits))
        for request in by_argmax:
            first = first_row[request.request_id]
            drafts = out.spec_token_ids.get(request.request_id, [])
            for position, token in enumerate(tokens[first : first + 1 + len(drafts)]):
                append(request, token)
                if position == len(drafts) or token != drafts[position]:
                    break
                num_rejected[request.request_id] -= 1
                if request.is_finished:
                    break
    by_position = [r for r in alive if r not in by_argmax]
    failed = _verify_by_position(logits, out, sample, append, first_row, by_position, num_rejected)
    runs = [
        (out.num_drafts(r), out.num_drafts(r) - num_rejected[r.request_id])
        for r in alive
        if out.num_drafts(r) and r not in failed
    ]
    return Verified(num_rejected, failed, runs)


def _verify_by_position(
    logits: torch.Tensor,
    out: SchedulerOutput,
    sample: Sample,
    append: Callable[[Request, int], None],
    first_row: dict[str, int],
    alive: list[Request],
    num_rejected: dict[str, int],
) -> list[Request]:
    """``verify`` for ``alive``, position by position over them with ``sample`` (one call
    a position), counting down ``num_rejected``; the requests whose sampling raised."""
    failed: list[Request] = []
    position = 0
    while alive:
        rows = [first_row[r.request_id] + position for r in alive]
        sampled, bad = sample(logits[rows], alive)
        failed += bad
        going_on = []
        for request in alive:
            if request in bad:
                continue
            token, logprob = sampled[request.request_id]
            if logprob is not None:
                request.logprobs.append(logprob)
            append(request, token)
            drafts = out.spec_token_ids.get(request.request_id, [])
            if position < len(drafts) and token == drafts[position]:
                num_rejected[request.request_id] -= 1
                if not request.is_finished:
                    going_on.append(request)
        alive = going_on
        position += 1
    return failed
