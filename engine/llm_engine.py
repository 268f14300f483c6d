"""The engine loop: schedule, execute, sample, update."""

import logging
from collections.abc import Callable

import torch
from transformers import AutoTokenizer

from kvserve.engine.config import EngineConfig
from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.device_copy import to_device
from kvserve.engine.execution_plan import ExecutionPlan, plan_execution
from kvserve.engine.executor import ExecutorFailedError, build_executor
from kvserve.engine.kv_cache_manager import KVCacheManager
from kvserve.engine.kv_events import KVEventLog
from kvserve.engine.kv_events_publisher import ZmqEventPublisher
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.outputs import CompletionOutput, Logprob, RequestOutput
from kvserve.engine.parent_request import ParentRequest, child_id, child_params
from kvserve.engine.request import Request
from kvserve.engine.sampler import Sampler, logprobs_of
from kvserve.engine.sampling_params import SamplingParams, request_seed
from kvserve.engine.scheduler import (
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
)
from kvserve.engine.startup import StartupPhases
from kvserve.engine.structured.compiler import GrammarCompiler
from kvserve.engine.structured.matcher import RequestGrammar

log = logging.getLogger(__name__)
# Failed model forwards in a row after which the engine gives up (the device is broken).
MAX_CONSECUTIVE_STEP_FAILURES = 3
# Seconds a step with nothing to run waits for a grammar compile before returning.
GRAMMAR_POLL_S = 0.02


class EngineDeadError(RuntimeError):
    """The engine cannot go on: no request can make progress."""


class LLMEngine:
    """Requests in, tokens out, one ``step()`` at a time. Not thread-safe."""

    def __init__(
        self, config: EngineConfig, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.config = config
        self.startup = StartupPhases()
        with self.startup.measure("load"):
            self.model_config = ModelConfig.from_dir(config.model)
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        plan = plan_execution(config, self.model_config)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.runner = build_executor(config, self.model_config, plan, progress, self.startup)
        self.plan: ExecutionPlan = self.runner.plan
        events = config.kv_events_config
        self.kv_events: ZmqEventPublisher | None = None
        if events is not None and events.enabled:
            medium = "GPU" if self.plan.device.type == "cuda" else "CPU"
            self.kv_events = ZmqEventPublisher(events, medium)
        with self.startup.measure("kv_alloc"):
            assert self.plan.num_kv_blocks is not None
            self.kv = KVCacheManager(
                self.plan.num_kv_blocks,
                self.plan.block_size,
                config.enable_prefix_caching,
                KVEventLog() if self.kv_events is not None else None,
                config.prefix_caching_hash_algo,
            )
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs,
                config.max_num_batched_tokens,
                self.max_model_len,
                config.long_prefill_token_threshold,
            ),
            self.kv,
        )
        self.sampler = Sampler(self.eos_token_ids)
        self.grammars = GrammarCompiler(
            self.tokenizer, self.model_config.vocab_size, tuple(sorted(self.eos_token_ids))
        )
        self._compiling: list[Request] = []  # constrained requests whose grammar is not ready
        self.requests: dict[str, Request] = {}
        self._parents: dict[str, ParentRequest] = {}  # requests of n > 1 samples, by id
        self._parent_of: dict[str, ParentRequest] = {}  # ... by their samples' ids
        self._num_taken = 0  # requests accepted so far: the index of an unseeded one's seed
        self._consecutive_failures = 0
        log.info("execution plan: %s", self.plan)
        log.info("startup phases: %s", self.startup)

    @property
    def max_model_len(self) -> int:
        return self.plan.max_model_len

    @property
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request (its ``params.n`` samples: ``ParentRequest``), or raise ValueError
        if it can never run."""
        ids = [request_id] if params.n == 1 else [child_id(request_id, i) for i in range(params.n)]
        for taken in {request_id, *ids}:
            if taken in self.requests or taken in self._parents:
                raise ValueError(f"request id {taken!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._validate(token_ids, params)
        samples = [params] if params.n == 1 else child_params(params)
        requests = [
            self._request(i, token_ids, text, p, arrival_time)
            for i, p in zip(ids, samples, strict=True)
        ]
        held: list[Request] = []
        if params.n > 1:
            parent = ParentRequest(request_id, requests, self.config.enable_prefix_caching)
            self._parents[request_id] = parent
            self._parent_of.update(dict.fromkeys(ids, parent))
            held = parent.held
        for request in requests:
            if request.grammar is not None:
                self._compiling.append(request)
            self.requests[request.request_id] = request
            if request not in held:
                self.scheduler.add(request)

    def _request(
        self,
        request_id: str,
        token_ids: list[int],
        text: str | None,
        params: SamplingParams,
        arrival_time: float | None,
    ) -> Request:
        detokenizer = Detokenizer(
            self.tokenizer, token_ids, params.stop, params.skip_special_tokens
        )
        grammar = None
        if params.constraint is not None:
            grammar = RequestGrammar(self.grammars.submit(params.constraint))
        if params.seed is None and self.config.seed is not None:
            params = params.replace(seed=request_seed(self.config.seed, self._num_taken))
        self._num_taken += 1
        return Request(
            request_id,
            token_ids,
            params,
            text,
            arrival_time,
            detokenizer=detokenizer,
            grammar=grammar,
        )

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, which leaves no room to generate "
                f"within the model's context of {self.max_model_len} tokens"
            )
        needed = self.kv.blocks_needed(len(token_ids) + 1)
        if needed > self.kv.pool.num_blocks:
            raise ValueError(
                f"the prompt needs {needed} KV blocks but the cache has only "
                f"{self.kv.pool.num_blocks}"
            )
        vocab = self.model_config.vocab_size
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
        ):
            if not all(0 <= t < vocab for t in ids):
                raise ValueError(f"invalid {name}: token ids must be in [0, {vocab})")
        for name, num in (
            ("logprobs", params.logprobs),
            ("prompt_logprobs", params.prompt_logprobs),
        ):
            if num is not None and num > vocab:
                raise ValueError(f"invalid {name}: {num} (must be at most the vocabulary, {vocab})")

    def abort_request(self, request_id: str) -> int:
        """Abort a request (each of its samples still running); how many were."""
        parent = self._parents.pop(request_id, None)
        children = [request_id] if parent is None else [c.request_id for c in parent.children]
        aborted = 0
        for child in children:
            self._parent_of.pop(child, None)
            request = self.requests.pop(child, None)
            if request is not None:
                aborted += 1
                if parent is None or request not in parent.held:
                    self.scheduler.abort(request)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One step (see ``_step``), its samples' outputs under their request's id; then the
        held samples that may start now go to the scheduler, and the step's KV-cache events,
        if any, to the publisher."""
        try:
            return [self._relabel(output) for output in self._step()]
        finally:
            self._release_samples()
            self._publish_kv_events()

    def _relabel(self, output: RequestOutput) -> RequestOutput:
        parent = self._parent_of.get(output.request_id)
        if parent is None:
            return output
        output = parent.relabel(output)
        if output.finished:
            del self._parents[parent.request_id]
            for child in parent.children:
                del self._parent_of[child.request_id]
        return output

    def _release_samples(self) -> None:
        for parent in self._parents.values():
            for request in parent.release():
                self.scheduler.add(request)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's ``reset_prefix_cache``: only while no request
        holds a block (else False)."""
        done = self.kv.pool.reset_prefix_cache()
        self._publish_kv_events()
        return done

    def check_health(self) -> None:
        """``EngineDeadError`` if the executor can run no further step (a worker is gone)."""
        try:
            self.runner.check_health()
        except ExecutorFailedError as exc:
            raise EngineDeadError(f"the executor failed: {exc}") from exc

    def shutdown(self) -> None:
        """Stop the executor's workers; close the KV-event publisher, after it sent what is
        queued; stop compiling."""
        self.runner.shutdown()
        self.grammars.shutdown()
        if self.kv_events is not None:
            self.kv_events.close()

    def _publish_kv_events(self) -> None:
        recorded = self.kv.pool.events
        if self.kv_events is not None and recorded is not None and (events := recorded.take()):
            self.kv_events.publish(events)

    def _step(self) -> list[RequestOutput]:
        """Run one batch and sample one token per request that reached its end.

        What one request's data can break stays with that request: if sampling the batch
        raises, its rows are sampled one by one, and a request whose own sampling, prompt
        log-probabilities, stop check or text raises finishes with reason ``"error"`` while
        the others go on. A model forward that raises fails every request of the step.
        Failed requests' blocks are freed at once and ``stats.num_failed_steps`` counts the
        step. ``MAX_CONSECUTIVE_STEP_FAILURES`` failed forwards in a row raise
        ``EngineDeadError``: then nothing can run any more. So does one executor failure (a
        tensor-parallel rank died, raised or stopped answering: the ranks no longer agree).

        A constrained request waits while its grammar compiles (the others run); one whose
        grammar failed to compile finishes with ``"error"``. With nothing to run but
        compiles, the step waits a moment for one of them.
        """
        unusable = self._fail_unusable_grammars()
        out = self.scheduler.schedule()
        if not out.scheduled:
            if self._compiling:
                grammar = self._compiling[0].grammar
                assert grammar is not None
                grammar.wait(GRAMMAR_POLL_S)
            return unusable
        try:
            logits = self.runner.execute(out)
        except ExecutorFailedError as exc:
            self._fail_step(out, exc)
            raise EngineDeadError(f"the executor failed: {exc}") from exc
        except Exception as exc:
            return unusable + self._fail_step(out, exc)
        self._consecutive_failures = 0
        sampling = out.sampling_requests
        sampled, failed = self._sample(logits[: len(sampling)], sampling)
        failed += self._record_prompt_logprobs(out.prompt_logprob_spans, logits[len(sampling) :])
        for request in failed:
            self._fail(request)
        kept = out.without_finished()
        token_ids = []
        for request in kept.sampling_requests:
            token_id, logprob = sampled[request.request_id]
            token_ids.append(token_id)
            if logprob is not None:
                request.logprobs.append(logprob)
        self.scheduler.update(kept, token_ids, self.eos_token_ids)
        outputs = [self._output(r) for r in sampling]
        outputs += [self._output(r) for r in failed if r not in sampling]
        finished = [r for r, _ in out.scheduled if r.is_finished]
        for request in finished:
            self.requests.pop(request.request_id, None)
        if any(r.finish_reason == "error" for r in finished):
            self.scheduler.stats.num_failed_steps += 1
        return unusable + outputs

    def _fail_unusable_grammars(self) -> list[RequestOutput]:
        """Fail the waiting requests whose grammar failed to compile; their outputs."""
        failed, self._compiling = [], [r for r in self._compiling if not r.is_finished]
        for request in [r for r in self._compiling if not r.is_compiling]:
            self._compiling.remove(request)
            assert request.grammar is not None
            if request.grammar.error is not None:
                log.error("request %s: %s", request.request_id, request.grammar.error)
                self._fail(request)
                self.requests.pop(request.request_id, None)
                failed.append(self._output(request))
        return failed

    def _sample(
        self, logits: torch.Tensor, requests: list[Request]
    ) -> tuple[dict[str, tuple[int, Logprob | None]], list[Request]]:
        """Each request's token and logprob, sampled as one batch or, if that raises, row by
        row; and the requests whose own row raised."""
        try:
            out = self.sampler(logits, requests)
            rows = zip(out.token_ids, out.logprobs, strict=True)
            return {r.request_id: row for r, row in zip(requests, rows, strict=True)}, []
        except Exception:
            log.exception("sampling a batch of %d failed; sampling row by row", len(requests))
        sampled, failed = {}, []
        for row, request in enumerate(requests):
            try:
                out = self.sampler(logits[row : row + 1], [request])
            except Exception:
                log.exception("sampling request %s failed", request.request_id)
                failed.append(request)
                continue
            sampled[request.request_id] = (out.token_ids[0], out.logprobs[0])
        return sampled, failed

    def _fail_step(self, out: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """The forward raised: nothing in it can be trusted, so all its requests fail."""
        self._consecutive_failures += 1
        self.scheduler.stats.num_failed_steps += 1
        requests = [r for r, _ in out.scheduled]
        log.error(
            "a step of %d requests failed (%d in a row)",
            len(requests),
            self._consecutive_failures,
            exc_info=exc,
        )
        for request in requests:
            self._fail(request)
            self.requests.pop(request.request_id, None)
        if self._consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
            raise EngineDeadError(
                f"{self._consecutive_failures} steps in a row failed; last: {exc!r}"
            ) from exc
        return [self._output(r) for r in requests]

    def _fail(self, request: Request) -> None:
        """Finish ``request`` with reason ``"error"`` and free its blocks."""
        parent = self._parent_of.get(request.request_id)
        if request.is_finished or (parent is not None and request in parent.held):
            request.finish("error")
        else:
            self.scheduler.abort(request, "error")

    @staticmethod
    def _record_prompt_logprobs(
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

    @staticmethod
    def _text(request: Request) -> str:
        detokenizer = request.detokenizer
        assert detokenizer is not None
        if request.finish_reason == "error":
            return ""
        if request.is_finished:
            detokenizer.flush()
        return detokenizer.take(request.is_finished)

    def _output(self, request: Request) -> RequestOutput:
        """What is new in the request since its previous output (a delta, see
        ``RequestOutput``): it slices only the new tokens and logprobs, so a step's work does
        not grow with the output. A request whose text raises fails (reason "error")."""
        try:
            text = self._text(request)
        except Exception:
            log.exception("the text of request %s failed", request.request_id)
            self._fail(request)
            text = ""
        sent, total = request.num_emitted_tokens, request.num_output_tokens
        tokens = request.all_token_ids[request.num_prompt_tokens + sent :]
        logprobs = request.logprobs[sent:] if request.params.logprobs is not None else None
        first = request.num_outputs == 0
        request.num_emitted_tokens, request.num_outputs = total, request.num_outputs + 1
        completion = CompletionOutput(
            0,
            tokens,
            text,
            request.finish_reason,
            request.stop_reason,
            logprobs,
            num_output_tokens=total,
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=request.is_finished,
            num_cached_tokens=request.num_cached_prompt_tokens,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            last_token_time=request.last_token_time,
            finished_time=request.finished_time,
            prompt_logprobs=request.prompt_logprobs
            if first and request.params.prompt_logprobs is not None
            else None,
        )
