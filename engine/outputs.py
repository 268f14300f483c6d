"""What the engine hands back for each request."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Logprob:
    """One position: the log-probability of its token and the ``top`` alternatives
    (``(token id, logprob)``, most likely first), from the log-softmax of the raw logits."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]  # all generated so far
    text: str
    finish_reason: str | None = None  # None while running, then "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or string that ended it
    logprobs: list[Logprob] | None = None  # one per token, when asked for


@dataclass
class RequestOutput:
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
