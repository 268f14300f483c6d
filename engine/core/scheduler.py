"""Which requests run this step, and how many of their tokens."""

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request, RequestStatus
from kvserve.engine.spec_decode.stats import SpecDecodeStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    """``long_prefill_token_threshold``: the most prompt tokens one request computes in a
    step (0: up to the whole budget), so a long prefill shares the steps with the running
    streams' decodes over several steps instead of stalling them for one long one.
    ``max_loras``: the most LoRA adapters the running requests may use at once (a waiting
    request of another adapter waits; the others pass it); 0 with LoRA off."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    long_prefill_token_threshold: int = 0
    max_loras: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be >= 0, got "
                f"{self.long_prefill_token_threshold}"
            )

    def chunk(self, remaining: int, budget: int) -> int:
        """Tokens a request with ``remaining`` uncomputed tokens gets of ``budget``."""
        cap = self.long_prefill_token_threshold
        return min(remaining, budget, cap) if cap > 0 else min(remaining, budget)


@dataclass
class SchedulerOutput:
    """The step's work in batch order: each request with its number of new tokens, and the
    step's facts, settled by ``add`` as each request is scheduled (before anything runs),
    so the runner, the engine and ``Scheduler.update`` read them instead of working them
    out again from request state that the step changes:

    - ``sampling_requests``: those whose scheduled tokens reach their end, in batch order;
      each yields one token (the logits rows of the step, first).
    - ``prompt_logprob_spans``: for each request asking for prompt logprobs, the positions
      computed this step whose logits score the next prompt token (the logits rows after
      the sampling ones, in order).
    - ``spec_token_ids``: by request id, the draft tokens scheduled after a sampling
      request's last token (counted in its new tokens); such a request has a logits row for
      its last token and one for each draft, in order (speculative decoding).
    """

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    sampling_requests: list[Request] = field(default_factory=list)
    prompt_logprob_spans: list[tuple[Request, range]] = field(default_factory=list)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    def add(self, request: Request, num_new: int, drafts: list[int] | None = None) -> None:
        """Schedule ``num_new`` tokens of ``request`` from its ``num_computed_tokens`` on,
        the last ``len(drafts)`` of them ``drafts`` after its last token."""
        start = request.num_computed_tokens
        self.scheduled.append((request, num_new))
        if drafts:
            self.spec_token_ids[request.request_id] = drafts
        if start + num_new == request.num_tokens_with_placeholders + len(drafts or ()):
            self.sampling_requests.append(request)
        if request.params.prompt_logprobs is not None:
            end = min(start + num_new, request.num_prompt_tokens - 1)
            if end > start:
                self.prompt_logprob_spans.append((request, range(start, end)))

    def without_finished(self) -> "SchedulerOutput":
        """The same step less the requests finished since it was made (failed ones)."""
        return self.without([r for r, _ in self.scheduled if r.is_finished])

    def without(self, dropped: Collection[Request]) -> "SchedulerOutput":
        """The same step less the requests of ``dropped``."""
        gone = {id(r) for r in dropped}
        scheduled = [(r, n) for r, n in self.scheduled if id(r) not in gone]
        kept = {r.request_id for r, _ in scheduled}
        return SchedulerOutput(
            scheduled,
            self.preempted,
            [r for r in self.sampling_requests if id(r) not in gone],
            [(r, span) for r, span in self.prompt_logprob_spans if id(r) not in gone],
            {k: drafts for k, drafts in self.spec_token_ids.items() if k in kept},
        )

    def input_token_ids(self, request: Request, num_new: int) -> list[int]:
        """The ``num_new`` tokens of ``request`` this step computes, its drafts last (0 for
        each placeholder)."""
        start = request.num_computed_tokens
        tokens = request.all_token_ids[start : start + num_new]
        tokens += self.spec_token_ids.get(request.request_id, [])
        # a placeholder (async scheduling) is filled on the device before the step runs
        return tokens + [0] * (num_new - len(tokens))

    def num_drafts(self, request: Request) -> int:
        return len(self.spec_token_ids.get(request.request_id, ()))

    @property
    def num_sampling_rows(self) -> int:
        """The logits rows of the sampling requests: one each, and one per draft."""
        return len(self.sampling_requests) + sum(len(d) for d in self.spec_token_ids.values())

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_failed_steps: int = 0  # steps whose requests failed on an exception (engine's count)
    # Of num_waiting, those that cannot be scheduled yet whatever the free capacity (their
    # grammar is compiling): vLLM's reason "deferred"; the others wait for capacity.
    num_waiting_deferred: int = 0
    # With LoRA on: the adapters of the running and of the waiting requests, sorted.
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    # With speculative decoding on: the engine's counts of drafts (cumulative).
    spec_decoding: SpecDecodeStats | None = None


class Scheduler:
    """FCFS continuous batching with one token budget per step. A request that stops running
    (finished, aborted, preempted) gives back its blocks and state slot (``kv.free``) and
    whatever ``on_free`` frees (the sampler's history slot)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        on_free: Callable[[Request], None] | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.on_free = on_free
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        # No prefill or decode phase: every request's num_computed_tokens chases its
        # num_tokens. The budget goes to running requests first (a decode token or
        # the next prefill chunk), then to waiting ones; when blocks run out the
        # latest running request is preempted and will be recomputed.
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            remaining = request.num_tokens_with_placeholders - request.num_computed_tokens
            # a request at its last token may verify its drafts, as far as the budget goes
            drafts = request.spec_token_ids if remaining == 1 else []
            num_new = self.config.chunk(remaining + len(drafts), budget)
            drafts = drafts[: num_new - remaining]
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.add(request, num_new, drafts)
                request.spec_token_ids = []  # verified this step; the proposer guesses anew
                budget -= num_new
                index += 1
        # A request whose grammar is still compiling keeps its place; the others pass it.
        loras = {r.lora.serial for r in self.running if r.lora} if self.config.max_loras else set()
        for request in [r for r in self.waiting if not r.is_compiling]:
            if budget <= 0 or out.preempted or len(self.running) >= self.config.max_num_seqs:
                break
            lora = request.lora
            if lora is not None and lora.serial not in loras:
                if len(loras) >= self.config.max_loras:
                    continue
                loras.add(lora.serial)
            hit = self.kv.computed_blocks(request)
            num_cached = hit.num_blocks * self.kv.block_size
            num_new = self.config.chunk(request.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(request, num_new, hit):
                break
            self.waiting.remove(request)
            self.stats.prefix_cache_queries += request.num_tokens
            self.stats.prefix_cache_hits += num_cached
            request.num_computed_tokens = num_cached
            if request.first_scheduled_time is None:
                request.num_cached_prompt_tokens = num_cached
                request.first_scheduled_time = time.monotonic()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.add(request, num_new)
            budget -= num_new
        self._refresh_stats()
        return out

    def _preempt(self, request: Request) -> None:
        self._free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        self.stats.num_preemptions += 1

    def update(self, out: SchedulerOutput, sampled: list[int], eos_token_ids: set[int]) -> None:
        """Append the sampled tokens (``sampled`` follows ``out.sampling_requests``) and
        ``advance``."""
        now = time.monotonic()
        for request, token in zip(out.sampling_requests, sampled, strict=True):
            self.append_token(request, token, eos_token_ids, now)
        self.advance(out)

    def append_token(
        self, request: Request, token: int, eos_token_ids: set[int], now: float | None = None
    ) -> None:
        """Append one sampled token (at ``now``, default the clock's); finish the request if
        it hits a stop condition, or if its stop check raised (reason ``"error"``: one
        request's text cannot stop the others)."""
        request.all_token_ids.append(token)
        now = time.monotonic() if now is None else now
        if request.first_token_time is None:
            request.first_token_time = now
        request.last_token_time = now
        try:
            self._check_stop(request, token, eos_token_ids)
        except Exception:
            log.exception("the stop check of request %s failed", request.request_id)
            request.finish("error")

    def advance(self, out: SchedulerOutput, num_rejected: Mapping[str, int] | None = None) -> None:
        """Advance each scheduled request by its tokens, less its rejected drafts
        (``num_rejected``, by request id); the blocks past its computed tokens (those of
        rejected drafts, or a draft model's beyond the drafts scheduled) go back to the pool;
        then ``settle``."""
        for request, num_new in out.scheduled:
            rejected = num_rejected.get(request.request_id, 0) if num_rejected else 0
            request.num_computed_tokens += num_new - rejected
            if not request.is_finished:
                self.kv.free_past_computed(request)
        self.settle([request for request, _ in out.scheduled])

    def settle(self, requests: list[Request]) -> None:
        """After a step's tokens were appended: index the blocks now computed of each of
        ``requests`` that holds blocks, and free the finished ones, from whichever queue they
        are in (with async scheduling, one preempted while its last step was in flight
        finishes waiting)."""
        for request in requests:
            if request.block_tables:
                self.kv.cache_computed_blocks(request)
            if request.is_finished:
                if request in self.running:
                    self._remove(request)
                elif request in self.waiting:
                    self.waiting.remove(request)
        self._refresh_stats()

    def _check_stop(self, request: Request, token: int, eos_token_ids: set[int]) -> None:
        params = request.params
        if request.grammar is not None:
            self._check_grammar_stop(request, token)
        elif token in params.stop_token_ids:
            request.finish("stop", token)
        elif token in eos_token_ids and not params.ignore_eos:
            request.finish("stop", None)
        elif (stop := request.add_text(token)) is not None:
            request.finish("stop", stop)
        elif self._at_length(request):
            request.finish("length")

    def _check_grammar_stop(self, request: Request, token: int) -> None:
        """A constrained request ends when its grammar accepted EOS (the mask allows EOS
        only where the grammar may end), or at its length; stop ids and strings do not
        count, so they cannot cut the output short of the grammar."""
        assert request.grammar is not None
        request.grammar.accept(token)
        request.add_text(token)
        if request.grammar.is_terminated:
            request.finish("stop", None)
        elif self._at_length(request):
            request.finish("length")

    def _at_length(self, request: Request) -> bool:
        return (
            len(request.all_token_ids) - request.num_prompt_tokens == request.params.max_tokens
            or request.num_tokens >= self.config.max_model_len
        )

    def abort(self, request: Request, reason: str = "abort") -> None:
        """Drop a request wherever it is, finished with ``reason``; its blocks are freed at once."""
        if request.is_finished:
            return
        request.finish(reason)
        if request in self.waiting:
            self.waiting.remove(request)
        else:
            self._remove(request)
        self._refresh_stats()

    def _remove(self, request: Request) -> None:
        self.running.remove(request)
        self._free(request)

    def _free(self, request: Request) -> None:
        self.kv.free(request)
        if self.on_free is not None:
            self.on_free(request)

    def _refresh_stats(self) -> None:
        self.stats.num_running = len(self.running)
        self.stats.num_waiting = len(self.waiting)
        self.stats.num_waiting_deferred = sum(1 for r in self.waiting if r.is_compiling)
        self.stats.kv_cache_usage = self.kv.usage
        if self.config.max_loras:
            self.stats.running_lora_adapters = _adapters(self.running)
            self.stats.waiting_lora_adapters = _adapters(self.waiting)


def _adapters(requests) -> tuple[str, ...]:
    return tuple(sorted({r.lora.name for r in requests if r.lora is not None}))
