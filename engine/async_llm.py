"""The engine for an event loop: ``async for out in llm.generate(...)``, ``llm.abort(id)``.

One thread owns the ``LLMEngine`` and runs ``step()`` in a loop; nothing else touches
it. The event loop hands commands over through a thread-safe queue (``AddRequest``,
``AbortRequest``, ``AddLoRA``, ``RemoveLoRA``, ``Shutdown``: one small type each, applied
in order), and the
thread hands each request's outputs back to that request's ``asyncio.Queue`` with
``call_soon_threadsafe``. So an HTTP handler never waits on a model step, and a step
never waits on HTTP. With no unfinished request the thread sleeps on an event; woken, it
lets the requests sent together arrive before its first step (``ARRIVAL_QUIET_S``).

Each step's outputs cross to the event loop in one ``call_soon_threadsafe`` (one wake-up of
the loop per step, not one per request). Build the engine with ``engine_builder.build_engine``:
the torch work of loading and warm-up must not leave an OpenMP team on a thread that outlives
it.
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator

from kvserve.engine.async_messages import (
    AbortRequest,
    AddLoRA,
    AddRequest,
    EngineCommand,
    RemoveLoRA,
    Shutdown,
    StepObserver,
)
from kvserve.engine.core.outputs import RequestOutput
from kvserve.engine.llm_engine import EngineDeadError, LLMEngine
from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

ARRIVAL_QUIET_S = 0.002
"""Woken from idle by a command, the step loop waits until none has come for this long (or
``ARRIVAL_WINDOW_S`` has passed) before its first step: requests sent together (a client's
concurrent calls, the next turns of conversations that finished in the same step) then
start in one step. Started one by one, the first would run alone while the rest queue up,
and stay a step out of phase: every later prompt of the others would then stall its
stream for a prefill step."""
ARRIVAL_WINDOW_S = 0.010
IDLE_HEALTH_CHECK_S = 1.0
"""While idle, the step loop asks the engine this often whether it can still run a step (a
tensor-parallel worker may die between steps): a dead engine shows in /health within it."""


class RequestFailedError(RuntimeError):
    """The engine failed this request (finish reason ``"error"``); the others go on."""


def _put_each(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for stream, item in items:
        stream.put_nowait(item)


def _error_of(call) -> Exception | None:
    """What ``call()`` raised (None: nothing), for the caller on the event loop."""
    try:
        call()
    except Exception as exc:
        return exc
    return None


class AsyncLLM:
    def __init__(self, engine: LLMEngine, observer: StepObserver | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.grammars = engine.grammars  # thread-safe: the server checks constraints with it
        self.max_model_len = engine.max_model_len
        # What the server reads of the engine's settings (it never reaches into the engine).
        self.model_path = engine.config.model
        self.max_num_seqs = engine.plan.max_num_seqs
        self.enable_prefix_caching = engine.config.enable_prefix_caching
        self._observer = observer
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.dead: asyncio.Event | None = None  # set on the event loop once the loop died
        self.last_progress = time.monotonic()  # heartbeat: last step, or last idle wake-up
        self.num_unfinished = 0  # requests added and not yet finished or aborted
        self.stats = engine.stats
        self._num_pending = 0  # adds handed over, not yet taken by the engine (event loop only)

    def start(self) -> None:
        """Start the step thread; call from the event loop that will consume outputs."""
        self._loop = asyncio.get_running_loop()
        self.dead = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="kvserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._send(Shutdown())
            self._thread.join()
            self._thread = None
        self.engine.shutdown()

    @property
    def num_waiting(self) -> int:
        """Requests not running yet: waiting in the engine or still being handed over."""
        return self._num_pending + self.stats.num_waiting

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request (under ``lora_request``'s adapter, if given); raises
        ``ValueError`` if the engine refuses it, else its outputs.

        Leaving the returned iterator before the request finished aborts the request.
        """
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        assert self._loop is not None, "start() first"
        stream: asyncio.Queue = asyncio.Queue()
        accepted = self._loop.create_future()
        self._send(
            AddRequest(request_id, prompt, params, arrival_time, stream, accepted, lora_request)
        )
        if self.error is not None and not accepted.done():
            # The loop died after the check above: it may have drained the queue already.
            accepted.set_exception(EngineDeadError(str(self.error)))
        self._num_pending += 1
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        finally:
            self._num_pending -= 1
        return self._outputs(request_id, stream)

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        async for output in await self.add_request(request_id, prompt, params):
            yield output

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Serve an adapter (``LLMEngine.add_lora``, in the engine's thread); raises its
        ``ValueError`` if it cannot be served."""
        await self._settled(lambda done: AddLoRA(lora_request, done))

    async def remove_lora(self, lora_name: str) -> None:
        """Stop serving an adapter (``LLMEngine.remove_lora``); KeyError if not served."""
        await self._settled(lambda done: RemoveLoRA(lora_name, done))

    async def _settled(self, command) -> None:
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        assert self._loop is not None, "start() first"
        done = self._loop.create_future()
        self._send(command(done))
        await done

    def abort(self, request_id: str) -> None:
        """Abort a request: its blocks are freed before the next step."""
        self._send(AbortRequest(request_id))

    async def _outputs(self, request_id: str, stream: asyncio.Queue) -> AsyncIterator:
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(str(item)) from item
                finished = item.finished
                if any(c.finish_reason == "error" for c in item.outputs):
                    raise RequestFailedError(f"the engine failed on request {request_id}")
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def _send(self, command: EngineCommand) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _deliver(self, stream: asyncio.Queue, item) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(stream.put_nowait, item)

    def _resolve(self, future: asyncio.Future, error: BaseException | None) -> None:
        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        assert self._loop is not None
        self._loop.call_soon_threadsafe(settle)

    def _apply_commands(self) -> bool:
        """Apply queued adds and aborts, in order; False once shutdown was asked for."""
        changed = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            match command:
                case Shutdown():
                    return False
                case AbortRequest(request_id):
                    changed = True
                    self._abort(request_id)
                case AddRequest():
                    changed = True
                    self._add(command)
                case AddLoRA(lora_request, done):
                    self._resolve(done, _error_of(lambda: self.engine.add_lora(lora_request)))
                case RemoveLoRA(lora_name, done):
                    self._resolve(done, _error_of(lambda: self.engine.remove_lora(lora_name)))
        if changed:
            self._observe([])
        return True

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            aborted = self.engine.abort_request(request_id)
            self.num_unfinished -= 1
            if self._observer is not None:
                self._observer.on_abort(request_id, self.engine.stats, aborted)

    def _add(self, command: AddRequest) -> None:
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt,
                command.params,
                command.arrival_time,
                command.lora_request,
            )
        except Exception as exc:  # refused (ValueError) or broken: that request only
            self._resolve(command.accepted, exc)
            return
        self._streams[command.request_id] = command.stream
        self.num_unfinished += 1
        self._resolve(command.accepted, None)

    def _observe(self, outputs: list[RequestOutput]) -> None:
        self.stats = self.engine.stats
        if self._observer is not None:
            self._observer.on_step(self.stats, outputs)

    def _run(self) -> None:
        try:
            while self._apply_commands():
                self.last_progress = time.monotonic()
                if not self.engine.has_unfinished_requests():
                    while not self._wakeup.wait(IDLE_HEALTH_CHECK_S):
                        self.engine.check_health()
                    self._wakeup.clear()
                    self._gather_arrivals()
                    continue
                outputs = self.engine.step()
                self._observe(outputs)
                delivered = []
                for output in outputs:
                    stream = self._streams.get(output.request_id)
                    if stream is None:
                        continue
                    delivered.append((stream, output))
                    if output.finished:
                        del self._streams[output.request_id]
                        self.num_unfinished -= 1
                if delivered:
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(_put_each, delivered)
            self._stop()
        except BaseException as exc:
            log.critical("the engine loop stopped; this server can serve no request", exc_info=exc)
            self._die(exc)

    def _gather_arrivals(self) -> None:
        """Wait while commands keep arriving (see ``ARRIVAL_QUIET_S``)."""
        deadline = time.monotonic() + ARRIVAL_WINDOW_S
        while (left := deadline - time.monotonic()) > 0:
            if not self._wakeup.wait(min(ARRIVAL_QUIET_S, left)):
                return
            self._wakeup.clear()

    def _queued_adds(self) -> list[AddRequest]:
        """Empty the queue: the adds in it (aborts and shutdowns no longer matter; adapter
        loads and unloads get ``EngineDeadError``)."""
        adds = []
        while not self._commands.empty():
            command = self._commands.get_nowait()
            if isinstance(command, AddRequest):
                adds.append(command)
            elif isinstance(command, AddLoRA | RemoveLoRA):
                self._resolve(command.done, EngineDeadError("the engine stopped"))
        return adds

    def _stop(self) -> None:
        """Shutdown: every open request is aborted (its blocks freed, the observer told), its
        stream and every add still queued get ``EngineDeadError``, and so does any later add."""
        error = EngineDeadError("the engine shut down")
        self.error = error
        for request_id in list(self._streams):
            self._deliver(self._streams[request_id], error)
            self._abort(request_id)
        for command in self._queued_adds():
            self._resolve(command.accepted, error)

    def _die(self, exc: BaseException) -> None:
        """The loop stopped for good: health turns false at once, the observer stops
        counting the open requests as running, then every open stream and every add still
        queued gets the error, and ``dead`` is set (the server then exits)."""
        self.error = exc
        adds = self._queued_adds()
        if self._observer is not None:
            self._observer.on_engine_dead(self.engine.stats, len(self._streams) + len(adds))
        for stream in self._streams.values():
            self._deliver(stream, exc)
        for command in adds:
            self._resolve(command.accepted, EngineDeadError(str(exc)))
        self._streams.clear()
        self.num_unfinished = 0
        assert self._loop is not None and self.dead is not None
        self._loop.call_soon_threadsafe(self.dead.set)
