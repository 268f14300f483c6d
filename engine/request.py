"""One generation task as the engine tracks it."""

import enum
import time

import torch

from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.outputs import Logprob
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.structured.matcher import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """A prompt, its generated tokens and how far the KV cache has caught up.

    ``num_computed_tokens`` chases ``num_tokens``: the tokens before it have
    their keys and values in the blocks of ``block_ids`` (the request's block
    table, append-only while it runs, emptied when it is preempted or ends).
    A preempted request keeps its output tokens and recomputes them as prompt.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks cached so far
        self.num_cached_prompt_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None  # when its latest output token was sampled
        self.finished_time: float | None = None
        self.detokenizer: Detokenizer | None = None  # set by the engine: text and stop strings
        self.logprobs: list[Logprob] = []  # one per output token, if params.logprobs is set
        # One per prompt token if params.prompt_logprobs is set; the first token has none.
        self.prompt_logprobs: list[Logprob | None] = [None]
        self.generator: torch.Generator | None = None
        self.grammar: RequestGrammar | None = None  # set by the engine for a constrained request
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def is_compiling(self) -> bool:
        """Its grammar is still compiling: it cannot be scheduled yet."""
        return self.grammar is not None and self.grammar.is_compiling

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finished_time = time.monotonic()
