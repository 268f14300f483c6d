"""A pipeline step's micro-batches: contiguous requests of about equal tokens, none empty,
each with its own sampling requests and prompt-logprob spans; the step's logits joined back
in one step's layout (every sampling row, then every prompt-logprob row)."""

import pytest
import torch

from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.executor.micro_batches import join_logits, split

from factories import make_request


def step(tokens: list[int], prompt_logprobs: set[int] = frozenset()) -> SchedulerOutput:
    """Request i's whole prompt of ``tokens[i]`` tokens, prompt logprobs for those named."""
    out = SchedulerOutput()
    for i, n in enumerate(tokens):
        params = {"prompt_logprobs": 1} if i in prompt_logprobs else {}
        out.add(make_request(n, **params), n)
    return out


@pytest.mark.parametrize(
    ("tokens", "count", "sizes"),
    [
        ([10, 10, 10, 10], 2, [[10, 10], [10, 10]]),
        ([30, 2, 2, 2], 2, [[30], [2, 2, 2]]),
        ([1, 1, 1, 30], 2, [[1, 1, 1], [30]]),
        ([5, 5, 5], 3, [[5], [5], [5]]),
        ([5], 2, [[5]]),
        ([40, 1], 4, [[40], [1]]),
    ],
)
def test_micro_batches_are_contiguous_about_equal_in_tokens_and_never_empty(tokens, count, sizes):
    out = step(tokens)
    parts = split(out, count)
    assert [[n for _, n in p.scheduled] for p in parts] == sizes
    assert [r for p in parts for r, _ in p.scheduled] == [r for r, _ in out.scheduled]
    assert [r for p in parts for r in p.sampling_requests] == out.sampling_requests


def test_the_joined_logits_are_the_steps_layout():
    out = step([3, 3, 3, 3], prompt_logprobs={1, 2})
    first, second = split(out, 2)
    assert [s for _, s in first.prompt_logprob_spans] == [range(0, 2)]
    assert [s for _, s in second.prompt_logprob_spans] == [range(0, 2)]
    # micro-batch rows: its sampling rows, then its prompt-logprob rows
    a = torch.tensor([[0.0], [1.0], [10.0], [11.0]])  # sampling r0, r1; r1's span
    b = torch.tensor([[2.0], [3.0], [20.0], [21.0]])  # sampling r2, r3; r2's span
    joined = join_logits([first, second], [a, b])
    assert joined.flatten().tolist() == [0, 1, 2, 3, 10, 11, 20, 21]
