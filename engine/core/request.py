"""One generation task as the engine tracks it."""

import enum
import time
from typing import TYPE_CHECKING

import torch

from kvserve.engine.core.block_hash import BlockHash
from kvserve.engine.core.outputs import Logprob
from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.structured.matcher import RequestGrammar

if TYPE_CHECKING:
    from kvserve.engine.lora.peft_adapter import LoRAAdapter


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """A prompt, its generated tokens and how far the KV cache has caught up.

    ``num_computed_tokens`` chases ``num_tokens``: the tokens before it have
    their keys and values in the blocks of ``block_tables`` (one block table per KV
    group of the model, append-only while it runs, emptied when it is preempted or ends;
    a sliding-window group's table has the null block where blocks left its window).
    A table list is only ever appended to, or has leading entries set to the null block
    (counted by ``num_skipped_blocks``); any other change replaces the list, which is how
    the runner's ``InputBatch`` tells a table it must copy whole from one it extends.
    ``state_slot`` is its recurrent-state slot (linear-attention models), held from its
    admission to its end or preemption. A preempted request keeps its output tokens and
    recomputes them as prompt.

    Its text and stop strings are its ``detokenizer``'s and its constraint its ``grammar``'s,
    both given at construction. A request built without a detokenizer (token ids only: the
    runner's warm-up, scheduler tests) has no text and no stop string. The scheduler gets
    the stop-string decision from ``add_text``, never from the detokenizer itself.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
        detokenizer: Detokenizer | None = None,
        grammar: RequestGrammar | None = None,
        lora: "LoRAAdapter | None" = None,
    ) -> None:
        self.request_id = request_id
        self.lora = lora  # the adapter it runs under (it keeps it, even once unloaded)
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled by steps still in flight, not yet on the host (async scheduling):
        # scheduled as the request's next inputs before their values are known.
        self.num_output_placeholders = 0
        self.status = RequestStatus.WAITING
        self.block_tables: list[list[int]] = []
        self.num_skipped_blocks: list[int] = []  # per group: leading entries dropped (null)
        self.state_slot: int | None = None
        self.block_hashes: list[BlockHash] = []  # chained hashes of the full blocks cached so far
        self.num_cached_prompt_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None  # when its latest output token was sampled
        self.finished_time: float | None = None
        self.detokenizer = detokenizer
        self.logprobs: list[Logprob] = []  # one per output token, if params.logprobs is set
        self.num_outputs = 0  # outputs handed out so far (the first carries prompt logprobs)
        self.num_emitted_tokens = 0  # output tokens already in an output: the delta's start
        # One per prompt token if params.prompt_logprobs is set; the first token has none.
        self.prompt_logprobs: list[Logprob | None] = [None]
        self.generator: torch.Generator | None = None
        self.grammar = grammar  # a constrained request's: what it may sample next
        # Draft tokens a proposer guessed after its last token (speculative decoding), which
        # the next step that schedules it at its end verifies.
        self.spec_token_ids: list[int] = []
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    @property
    def block_ids(self) -> list[int]:
        """The table of the first KV group (a dense model's only one); empty before
        admission."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def lora_name(self) -> str | None:
        return None if self.lora is None else self.lora.name

    @property
    def lora_id(self) -> int | None:
        return None if self.lora is None else self.lora.lora_int_id

    @property
    def prefix_root(self) -> BlockHash | None:
        """The parent key of its first block: None for the base model, its adapter's
        ``cache_key`` otherwise."""
        return None if self.lora is None else self.lora.cache_key

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """``num_tokens`` and the tokens in flight: what the scheduler schedules up to."""
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """A copy: for what needs them all (penalties), not for counting."""
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def is_compiling(self) -> bool:
        """Its grammar is still compiling: it cannot be scheduled yet."""
        return self.grammar is not None and self.grammar.is_compiling

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def add_text(self, token: int) -> str | None:
        """Add a sampled token to the text; the stop string it completes, if any. Stop
        strings count once ``min_tokens`` are out, and never for a constrained request
        (its grammar decides where it ends)."""
        if self.detokenizer is None:
            return None
        check_stop = self.grammar is None and self.num_output_tokens >= self.params.min_tokens
        return self.detokenizer.update([token], check_stop=check_stop)

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finished_time = time.monotonic()
