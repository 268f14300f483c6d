"""Asynchronous scheduling (``--async-scheduling``, vLLM's name): the engine schedules and
prepares step N+1 while step N runs.

One step thread runs the prepared steps in order (forward, then sampling), so the engine
thread's Python work (scheduling, input preparation, stop checks, detokenization,
streaming) overlaps the model: on a CPU the C kernels and torch release the GIL; on CUDA
the thread issues the launches. Because the step thread runs one step after the other, a
block freed (finished, aborted, preempted request) while a step is in flight is reused
only by a later step, which runs after it.

Step N's sampled tokens never wait for the host: when N+1 is scheduled, each request
sampling in N holds one *placeholder* (``Request.num_output_placeholders``) that the
scheduler schedules as its next input; the step thread fills that input from step N's
token tensor on the device before N+1 runs. The host copy of step N's tokens is appended,
checked for stops and handed out after N+1 was submitted. A request that finishes in step N
(a stop token or string, ``max_tokens``, an abort) has one thrown-away row in step N+1 and
emits nothing from it; its blocks are freed when step N is processed.

Sampling that reads the previous token on the host forces a sync *of the step*: when step
N+1 holds a request with a grammar (xgrammar fills the mask on the host, after the grammar
accepted the token of step N), step N is processed first and N+1 is submitted without the
requests that finished in N (no wasted row). Penalties and ``min_tokens`` do not: they read
each request's history on the device (``SamplingState``), which step N's sampling updated
before N+1 samples; a request's history slot is handed out when the step is submitted.
Prompt log-probabilities are recorded by the step thread, from the step's one copy.

A forward that raises fails its requests (as without async scheduling, one failed step
counted) and also those of the step queued behind it, whose placeholders can never be
filled.
"""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.core.outputs import Logprob, RequestOutput
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.device_copy import to_device
from kvserve.engine.executor import ExecutorFailedError
from kvserve.engine.executor.model_runner import StepInputs
from kvserve.engine.sampling_state import StepRows

if TYPE_CHECKING:
    from kvserve.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


def needs_host_tokens(request: Request) -> bool:
    """Whether sampling the request's next token reads its previous token on the host: only
    a grammar's mask does."""
    return request.grammar is not None


class PreviousStepFailedError(RuntimeError):
    """A step could not run: the one before it failed, so its placeholders have no tokens."""


@dataclass(frozen=True)
class PlaceholderFills:
    """Rows of a step's ``input_ids`` (``rows``) taken from the previous step's sampled
    tokens (``sources``, indices into its sampling requests), both on the device."""

    rows: torch.Tensor
    sources: torch.Tensor


@dataclass
class SampledStep:
    """What the step thread hands back: each sampling request's token and logprob, and the
    requests whose sampling or prompt logprobs raised."""

    sampled: dict[str, tuple[int, Logprob | None]]
    failed: list[Request]


@dataclass
class InFlightStep:
    out: SchedulerOutput
    result: "Future[SampledStep]"


class AsyncSteps:
    """The engine's steps with step N+1 submitted before step N is processed (see the module).
    Driven by ``LLMEngine.step`` on the engine thread; not thread-safe beyond that."""

    def __init__(self, engine: "LLMEngine") -> None:
        self.engine = engine
        self._thread: ThreadPoolExecutor | None = None  # started by the first step
        self.in_flight: InFlightStep | None = None
        self._last_tokens: torch.Tensor | None = None  # the step thread's latest sample

    def has_in_flight(self) -> bool:
        return self.in_flight is not None

    def step(self) -> list[RequestOutput]:
        """Schedule the next step, submit it, then process the step before it (first, when
        the next one needs its tokens on the host); that step's outputs."""
        engine = self.engine
        outputs = engine._fail_unusable_grammars()
        out = engine.scheduler.schedule()
        previous, self.in_flight = self.in_flight, None
        if previous is not None and any(needs_host_tokens(r) for r in out.sampling_requests):
            outputs += self._process(previous)
            previous, out = None, out.without_finished()
        if out.scheduled:
            self._submit(out, previous)
        elif previous is None:
            engine._wait_for_grammar()
        if previous is not None:
            outputs += self._process(previous)
        step = self.in_flight
        if step is not None and all(r.is_finished for r, _ in step.out.scheduled):
            self.in_flight = None  # only thrown-away rows: nothing left to overlap with
            outputs += self._process(step)
        return outputs

    def shutdown(self) -> None:
        """Stop the step thread once its step in flight, if any, ran (that step is still
        processed by the next ``step``, which starts a new thread if it runs another)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _submit(self, out: SchedulerOutput, previous: InFlightStep | None) -> None:
        """Prepare ``out`` (its placeholders taken from ``previous``), advance its requests
        as if it had run, and queue it on the step thread."""
        try:
            inputs = self.engine.runner.prepare(out)
            fills = self._fills(out, previous)
            rows = self.engine.sampling_state.rows(out.sampling_requests)
        except Exception as exc:  # failed when processed, like a forward that raised
            result: Future[SampledStep] = Future()
            result.set_exception(exc)
            inputs = None
        for request, num_new in out.scheduled:
            request.num_computed_tokens += num_new
        for request in out.sampling_requests:
            request.num_output_placeholders += 1
        if inputs is not None:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="kvserve-step")
            result = self._thread.submit(self._run, inputs, fills, rows, out)
        self.in_flight = InFlightStep(out, result)

    def _fills(
        self, out: SchedulerOutput, previous: InFlightStep | None
    ) -> PlaceholderFills | None:
        """Where ``out``'s placeholders sit in its flat batch, and which of ``previous``'s
        sampled tokens each one is."""
        rows, sources = [], []
        start = 0
        source_row: dict[int, int] = {}
        if previous is not None:
            source_row = {id(r): i for i, r in enumerate(previous.out.sampling_requests)}
        for request, num_new in out.scheduled:
            known = len(request.all_token_ids) - request.num_computed_tokens
            if request.num_output_placeholders and num_new > known:
                rows.append(start + known)
                sources.append(source_row[id(request)])
            start += num_new
        if not rows:
            return None
        device = self.engine.plan.device
        return PlaceholderFills(to_device(rows, device, torch.long), to_device(sources, device))

    def _run(
        self,
        inputs: StepInputs,
        fills: PlaceholderFills | None,
        rows: StepRows,
        out: SchedulerOutput,
    ) -> SampledStep:
        """On the step thread: fill the placeholders, run the forward, sample."""
        engine = self.engine
        last, self._last_tokens = self._last_tokens, None
        if fills is not None:
            if last is None:
                raise PreviousStepFailedError("the step before failed: its tokens never came")
            inputs.input_ids[fills.rows] = last[fills.sources]
        logits = engine.runner.run(inputs)
        sampled, failed, tokens = engine._sample_step(logits, out, rows)
        self._last_tokens = tokens
        return SampledStep(sampled, failed)

    def _process(self, step: InFlightStep) -> list[RequestOutput]:
        """Step ``step``'s tokens onto the host: append them, check stops, cache the blocks
        now computed, free the finished requests; the outputs of those not finished before."""
        engine, scheduler = self.engine, self.engine.scheduler
        out = step.out
        for request in out.sampling_requests:
            request.num_output_placeholders -= 1
        live = out.without_finished()
        try:
            result = step.result.result()
        except ExecutorFailedError as exc:
            engine._fail_step(live, exc)
            raise
        except PreviousStepFailedError:
            for request, _ in live.scheduled:
                engine._fail(request)
                engine.requests.pop(request.request_id, None)
            return [engine._output(r) for r, _ in live.scheduled]
        except Exception as exc:
            return engine._fail_step(live, exc)
        engine._consecutive_failures = 0
        failed = [r for r in result.failed if not r.is_finished]
        for request in failed:
            engine._fail(request)
        now = time.monotonic()
        for request in live.sampling_requests:
            if request.is_finished:
                continue
            token_id, logprob = result.sampled[request.request_id]
            if logprob is not None:
                request.logprobs.append(logprob)
            scheduler.append_token(request, token_id, engine.eos_token_ids, now)
        scheduler.settle([request for request, _ in live.scheduled])
        for request, _ in live.scheduled:
            if request.is_finished:
                engine.requests.pop(request.request_id, None)
        outputs = [engine._output(r) for r in live.sampling_requests]
        outputs += [engine._output(r) for r in failed if r not in live.sampling_requests]
        if any(r.finish_reason == "error" for r, _ in live.scheduled):
            scheduler.stats.num_failed_steps += 1
        return outputs


def async_unsupported(config: EngineConfig) -> str | None:
    """The setting of ``config`` async scheduling does not run with, or None: speculative
    decoding (its drafts come from the tokens a step samples) and pipeline stages (a step
    goes as several micro-batches, whose placeholders would sit in other batches)."""
    if config.speculative_config is not None:
        return "speculative_config"
    if config.pipeline_parallel_size > 1:
        return "pipeline_parallel_size > 1"
    return None
