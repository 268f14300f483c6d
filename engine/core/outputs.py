"""What the engine hands back for each request: one ``RequestOutput`` per step that brings
it something, each a delta (what is new since the request's previous output)."""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Logprob:
    """One position: the log-probability of its token and the ``top`` alternatives
    (``(token id, logprob)``, most likely first), from the log-softmax of the raw logits."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class CompletionOutput:
    """What is new since the request's previous output; ``num_output_tokens`` counts all its
    output tokens so far (these included)."""

    index: int
    token_ids: list[int]  # new since the previous output
    text: str  # new since the previous output; the pieces add up to the final text
    finish_reason: str | None = None  # None while running, then "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or string that ended it
    logprobs: list[Logprob] | None = None  # one per token of ``token_ids``, when asked for
    num_output_tokens: int = field(kw_only=True)


@dataclass
class RequestOutput:
    """One request's delta: its ``outputs`` hold what is new since its previous output;
    ``prompt_logprobs`` come in its first output only; the counts and times are as of now.
    ``join_outputs`` turns a request's deltas back into its complete output."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None  # when the latest token of ``outputs`` was sampled
    finished_time: float | None = None
    prompt_logprobs: list[Logprob | None] | None = None  # None for the first prompt token


def join_outputs(deltas: Sequence[RequestOutput]) -> RequestOutput:
    """The deltas of one request, in order, as one output: per sample (``index``), tokens,
    text and logprobs concatenated, the samples in index order; the prompt logprobs of the
    first delta, everything else of the last (one delta is its own join: no copy)."""
    if len(deltas) == 1:
        return deltas[0]
    samples: dict[int, list[CompletionOutput]] = {}
    for delta in deltas:
        for piece in delta.outputs:
            samples.setdefault(piece.index, []).append(piece)
    joined = [_join(samples[index]) for index in sorted(samples)]
    return dataclasses.replace(
        deltas[-1], outputs=joined, prompt_logprobs=deltas[0].prompt_logprobs
    )


def _join(pieces: list[CompletionOutput]) -> CompletionOutput:
    last = pieces[-1]
    logprobs = None
    if last.logprobs is not None:
        logprobs = [lp for piece in pieces for lp in piece.logprobs or ()]
    return dataclasses.replace(
        last,
        token_ids=[t for piece in pieces for t in piece.token_ids],
        text="".join(piece.text for piece in pieces),
        logprobs=logprobs,
    )
