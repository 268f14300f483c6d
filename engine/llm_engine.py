"""The engine core's loop: schedule, execute, sample, update (requests come in through
``input_processor`` and leave as deltas through ``output_processor``)."""

import logging
from collections.abc import Callable, Sequence

import torch

from kvserve.engine.async_step import AsyncSteps, async_unsupported
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.outputs import Logprob, RequestOutput
from kvserve.engine.core.parent_request import ParentRequest, ParentRequests, child_id
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import (
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
)
from kvserve.engine.device_copy import to_device
from kvserve.engine.execution_plan import ExecutionPlan, plan_execution
from kvserve.engine.executor import ExecutorFailedError, build_executor
from kvserve.engine.executor.model_runner import ModelRunner
from kvserve.engine.host_copy import to_host_packed
from kvserve.engine.input_processor import InputProcessor
from kvserve.engine.kv_events import KVEventLog
from kvserve.engine.kv_events_publisher import ZmqEventPublisher
from kvserve.engine.lora.lora_registry import LoRARegistry
from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.lora.peft_adapter import LoRAAdapter
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.output_processor import delta_output, take_text
from kvserve.engine.prompt_logprobs import prompt_tables, record_prompt_logprobs
from kvserve.engine.sampler import Sampler
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.sampling_state import SamplingState, StepRows
from kvserve.engine.spec_decode.speculator import Speculator
from kvserve.engine.spec_decode.verifier import verify
from kvserve.engine.startup import StartupPhases
from kvserve.engine.structured.compiler import GrammarCompiler
from kvserve.engine.tokenizer import load_tokenizer

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
            self.model_config = ModelConfig.from_dir(config.model, config.quantization)
            self.tokenizer = load_tokenizer(config.model, config.tokenizer)
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
                self.plan.kv_groups,
                num_state_slots=self.plan.num_state_slots,
                max_step_tokens=self.plan.max_num_batched_tokens,
            )
        # The sampler's history on the device; its slots go back as requests stop running.
        self.sampling_state = SamplingState()
        self.sampler = Sampler(self.eos_token_ids, self.sampling_state)
        self.scheduler = Scheduler(
            SchedulerConfig(
                self.plan.max_num_seqs,
                self.plan.max_num_batched_tokens,
                self.max_model_len,
                config.long_prefill_token_threshold,
                config.max_loras if config.enable_lora else 0,
            ),
            self.kv,
            self.sampling_state.free,
        )
        self.loras: LoRARegistry | None = None
        if config.enable_lora:
            assert config.max_cpu_loras is not None  # EngineConfig defaults it
            self.loras = LoRARegistry(self.model_config, config.max_lora_rank, config.max_cpu_loras)
        self.speculator: Speculator | None = None
        if config.speculative_config is not None:
            draft = self.runner.draft if isinstance(self.runner, ModelRunner) else None
            self.speculator = Speculator(
                config.speculative_config, self.max_model_len, self.kv, draft
            )
            self.scheduler.stats.spec_decoding = self.speculator.stats
        self.grammars = GrammarCompiler(
            self.tokenizer, self.model_config.vocab_size, tuple(sorted(self.eos_token_ids))
        )
        self._compiling: list[Request] = []  # constrained requests whose grammar is not ready
        self.requests: dict[str, Request] = {}  # by id; a request of n > 1: its samples'
        self.parents = ParentRequests()
        self.inputs = InputProcessor(
            self.tokenizer,
            self.model_config.vocab_size,
            self.max_model_len,
            self.kv,
            self.grammars,
            config.seed,
        )
        self._consecutive_failures = 0
        self._async: AsyncSteps | None = None
        self.set_async_scheduling(config.async_scheduling)
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
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request (its ``params.n`` samples: ``ParentRequest``), under the adapter
        of ``lora_request`` (loaded first if it is not yet), or raise ValueError if it can
        never run."""
        ids = [request_id] if params.n == 1 else [child_id(request_id, i) for i in range(params.n)]
        for taken in {request_id, *ids}:
            if taken in self.requests or taken in self.parents:
                raise ValueError(f"request id {taken!r} is already in use")
        adapter = None if lora_request is None else self.add_lora(lora_request)
        requests = self.inputs.process(request_id, prompt, params, arrival_time, adapter)
        if params.n > 1:
            self.parents.add(ParentRequest(request_id, requests, self.config.enable_prefix_caching))
        for request in requests:
            if request.grammar is not None:
                self._compiling.append(request)
            self.requests[request.request_id] = request
            if not self.parents.is_held(request):
                self.scheduler.add(request)

    def add_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        """Serve an adapter (``LoRARegistry.add``); ValueError naming it if it cannot be
        (LoRA off, missing, corrupt, or not fitting the model), nothing else changed."""
        if self.loras is None:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name!r}: LoRA is not enabled (--enable-lora)"
            )
        return self.loras.add(lora_request)

    def remove_lora(self, name: str) -> None:
        """Stop serving adapter ``name`` (KeyError if it is not served). Requests already
        queued or running under it finish under it; new ones cannot name it."""
        if self.loras is None:
            raise KeyError(name)
        self.loras.remove(name)

    def list_loras(self) -> list[LoRARequest]:
        return [] if self.loras is None else list(self.loras.requests.values())

    def abort_request(self, request_id: str) -> int:
        """Abort a request (each of its samples still running); how many were."""
        parent = self.parents.pop(request_id)
        samples = [request_id] if parent is None else list(parent.index)
        aborted = 0
        for sample in samples:
            request = self.requests.pop(sample, None)
            if request is not None:
                aborted += 1
                if parent is None or request not in parent.held:
                    self.scheduler.abort(request)
        return aborted

    def set_async_scheduling(self, on: bool) -> None:
        """Turn async scheduling on or off while the engine is idle (a benchmark compares
        both on one engine); RuntimeError while requests are unfinished. Asked for with a
        setting it does not run with (``async_unsupported``), it stays off with a warning, as
        vLLM turns it off for such settings."""
        if self.has_unfinished_requests():
            raise RuntimeError("async scheduling changes only while no request is unfinished")
        unsupported = async_unsupported(self.config)
        if on and unsupported is not None:
            log.warning("async scheduling is off: %s does not run with it", unsupported)
            on = False
        if self._async is not None:
            self._async.shutdown()
        self._async = AsyncSteps(self) if on else None

    def has_unfinished_requests(self) -> bool:
        """Requests queued or running, or (async scheduling) a step still in flight."""
        in_flight = self._async is not None and self._async.has_in_flight()
        return self.scheduler.has_unfinished() or in_flight

    def step(self) -> list[RequestOutput]:
        """One step (see ``_step``), its samples' outputs under their request's id; then the
        held samples that may start now go to the scheduler, and the step's KV-cache events,
        if any, to the publisher."""
        try:
            if self._async is None:
                outputs = self._step()
            else:
                try:
                    outputs = self._async.step()
                except ExecutorFailedError as exc:
                    raise EngineDeadError(f"the executor failed: {exc}") from exc
            return [self.parents.relabel(output) for output in outputs]
        finally:
            for request in self.parents.release():
                self.scheduler.add(request)
            self._publish_kv_events()

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
        queued; stop compiling (and the step thread, after its step in flight)."""
        if self._async is not None:
            self._async.shutdown()
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
            self._wait_for_grammar()
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
        if out.spec_token_ids:
            failed = self._verify(out, logits)
        else:
            sampled, failed, _ = self._sample_step(logits, out)
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
        if self.speculator is not None:
            self.speculator.propose(r for r, _ in out.scheduled)
        outputs = [self._output(r) for r in sampling]
        outputs += [self._output(r) for r in failed if r not in sampling]
        finished = [r for r, _ in out.scheduled if r.is_finished]
        for request in finished:
            self.requests.pop(request.request_id, None)
        if any(r.finish_reason == "error" for r in finished):
            self.scheduler.stats.num_failed_steps += 1
        return unusable + outputs

    def _verify(self, out: SchedulerOutput, logits: torch.Tensor) -> list[Request]:
        """A step with draft tokens: each sampling request keeps the tokens
        ``spec_decode.verifier`` accepts, its rejected drafts' blocks are freed; the
        requests that failed."""
        assert self.speculator is not None
        rows = out.num_sampling_rows
        prompt = prompt_tables(out.prompt_logprob_spans, logits[rows:])
        failed = record_prompt_logprobs(
            prompt, to_host_packed(prompt.tables) if prompt.tables else []
        )
        for request in failed:
            self._fail(request)
        kept = out.without_finished()

        def append(request: Request, token: int) -> None:
            self.scheduler.append_token(request, token, self.eos_token_ids)

        verified = verify(
            logits[:rows], out, lambda rows, reqs: self._sample(rows, reqs)[:2], append
        )
        self.scheduler.advance(kept.without(verified.failed), verified.num_rejected)
        for request in verified.failed:
            self._fail(request)
        for num_drafts, num_accepted in verified.runs:
            self.speculator.stats.observe(num_drafts, num_accepted)
        return failed + verified.failed

    def _wait_for_grammar(self) -> None:
        """With nothing to run: wait a moment for the first grammar still compiling, if any."""
        if self._compiling:
            grammar = self._compiling[0].grammar
            assert grammar is not None
            grammar.wait(GRAMMAR_POLL_S)

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

    def _sample_step(
        self, logits: torch.Tensor, out: SchedulerOutput, rows: StepRows | None = None
    ) -> tuple[dict[str, tuple[int, Logprob | None]], list[Request], torch.Tensor]:
        """A step without drafts: its sampling requests' tokens (``_sample``) and its prompt
        logprobs recorded, from one copy to the host; the requests that failed either."""
        sampling = out.sampling_requests
        prompt = prompt_tables(out.prompt_logprob_spans, logits[len(sampling) :])
        sampled, failed, tokens, host = self._sample(
            logits[: len(sampling)], sampling, rows, prompt.tables
        )
        return sampled, failed + record_prompt_logprobs(prompt, host), tokens

    def _sample(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        rows: StepRows | None = None,
        also: Sequence[torch.Tensor] = (),
    ) -> tuple[
        dict[str, tuple[int, Logprob | None]], list[Request], torch.Tensor, list[list[list[float]]]
    ]:
        """Each request's token and logprob, sampled as one batch or, if that raises, row by
        row; the requests whose own row raised; the tokens on the logits' device, one per
        row (0 in a row that raised); and the rows of the ``also`` tables on the host, in
        the batch's copy (a copy of their own after a batch that raised). ``rows``: the
        requests' history slots, handed out now if not given (async scheduling hands them
        out when the step is submitted)."""
        rows = self.sampling_state.rows(requests) if rows is None else rows
        try:
            out = self.sampler(logits, requests, rows=rows, also=also)
            pairs = zip(out.token_ids, out.logprobs, strict=True)
            sampled = {r.request_id: pair for r, pair in zip(requests, pairs, strict=True)}
            return sampled, [], out.tokens, out.also
        except Exception:
            log.exception("sampling a batch of %d failed; sampling row by row", len(requests))
        sampled, failed = {}, []
        for row, request in enumerate(requests):
            try:
                out = self.sampler(logits[row : row + 1], [request], rows=rows.row(row))
            except Exception:
                log.exception("sampling request %s failed", request.request_id)
                failed.append(request)
                continue
            sampled[request.request_id] = (out.token_ids[0], out.logprobs[0])
        tokens = [sampled[r.request_id][0] if r not in failed else 0 for r in requests]
        host = to_host_packed(also) if also else []
        return sampled, failed, to_device(tokens, logits.device, torch.long), host

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
        if request.is_finished or self.parents.is_held(request):
            request.finish("error")
        else:
            self.scheduler.abort(request, "error")

    def _output(self, request: Request) -> RequestOutput:
        """The request's delta (``output_processor``); a request whose text raises fails
        (reason "error")."""
        try:
            text = take_text(request)
        except Exception:
            log.exception("the text of request %s failed", request.request_id)
            self._fail(request)
            text = ""
        return delta_output(request, text)
