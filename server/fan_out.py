"""One API request as engine requests, and their outputs merged back as they come.

One API request becomes one engine request per (prompt, sample): choice ``p * n + i``
is sample ``i`` of prompt ``p``, with seed ``seed + i`` when a seed is given, so that
the samples differ but each is reproducible. The engine's outputs are deltas; ``merge``
yields them as they come, each with its choice's index.
"""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from kvserve.engine.async_llm import EngineDeadError, RequestFailedError
from kvserve.engine.outputs import RequestOutput
from kvserve.engine.sampling_params import SamplingParams
from kvserve.server.admission import Reservation
from kvserve.server.errors import APIError, unavailable
from kvserve.server.request_params import invalid_parameter
from kvserve.server.state import ServerState

ENGINE_ERRORS = (EngineDeadError, RequestFailedError)


def engine_error(exc: EngineDeadError | RequestFailedError) -> APIError:
    """A 503 once the engine is dead (this replica is no longer ready: retry elsewhere), a
    500 for a request the engine failed on while it went on with the others."""
    if isinstance(exc, EngineDeadError):
        return unavailable("the engine stopped and this server can serve no request", "engine_dead")
    return APIError(500, "the engine failed while generating this request", code="engine_error")


def admit(state: ServerState, count: int, param: str) -> Reservation:
    """Reserve ``count`` engine requests against the queue limit (see ``admission``)."""
    try:
        return state.admission.reserve(count, param)
    except APIError as exc:
        if exc.status == 503:
            state.metrics.on_rejected()
        raise


def child_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    if params.seed is None:
        return [params] * n
    return [params.replace(seed=params.seed + i) for i in range(n)]


@dataclass
class FanOut:
    """The engine requests of one API request (choice ``i`` is ``request_ids[i]``, its
    outputs ``streams[i]``) and their admission, to close when the response is done."""

    reservation: Reservation
    request_ids: list[str]
    streams: list[AsyncIterator[RequestOutput]]


async def fan_out(
    state: ServerState,
    api_id: str,
    prompt_param: str,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    n: int,
) -> FanOut:
    """Admit the request, then add every (prompt, sample) to the engine; if one is
    refused, abort those added.

    With prefix caching on, the other samples of a prompt are added once the first has
    computed it, so that they share its cached blocks instead of computing their own."""
    reservation = admit(state, len(prompts) * n, "n" if n > 1 else prompt_param)
    samples = child_params(params, n)
    request_ids: list[str] = []
    streams: list[AsyncIterator[RequestOutput]] = []
    share = n > 1 and state.llm.enable_prefix_caching
    try:
        for p, prompt in enumerate(prompts):
            for i in range(n):
                request_id = state.engine_request_id(api_id, p * n + i)
                request_ids.append(request_id)
                streams.append(await state.llm.add_request(request_id, prompt, samples[i]))
                if i == 0 and share:
                    streams[-1] = await _after_prefill(streams[-1])
    except BaseException as exc:
        reservation.close()
        for request_id in request_ids:
            state.llm.abort(request_id)
        if isinstance(exc, ValueError):
            raise invalid_parameter(exc, "prompt") from None
        if isinstance(exc, ENGINE_ERRORS):
            raise engine_error(exc) from None
        raise
    return FanOut(reservation, request_ids, streams)


async def _after_prefill(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """Wait for the stream's first output, then return the stream, that output included."""
    first = await anext(stream)

    async def replay() -> AsyncIterator[RequestOutput]:
        yield first
        async for output in stream:
            yield output

    return replay()


async def merge(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """``(choice index, output)`` from every stream, as they come; leaving early aborts all."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
