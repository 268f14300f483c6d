"""One API request as engine requests, and their outputs merged back as they come.

One API request becomes one engine request per prompt, each with the body's ``n``: the engine
draws the ``n`` samples (``engine/core/parent_request.py``: seeds ``seed + i``, and the samples
after the first start from its cached prompt). Choice ``p * n + i`` is sample ``i`` of prompt
``p``. The engine's outputs are deltas; ``merge`` yields them as they come, each with its
choice's index.
"""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from kvserve.engine.async_llm import EngineDeadError, RequestFailedError
from kvserve.engine.core.outputs import RequestOutput
from kvserve.engine.lora.lora_request import LoRARequest
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


@dataclass
class FanOut:
    """The engine requests of one API request (prompt ``p`` is ``request_ids[p]``, its
    outputs ``streams[p]``, its samples choices ``p * n`` to ``p * n + n - 1``) and their
    admission, to close when the response is done."""

    reservation: Reservation
    request_ids: list[str]
    streams: list[AsyncIterator[RequestOutput]]
    n: int

    @property
    def num_choices(self) -> int:
        return len(self.streams) * self.n


async def fan_out(
    state: ServerState,
    api_id: str,
    prompt_param: str,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    n: int,
    lora: LoRARequest | None = None,
) -> FanOut:
    """Admit the request (``n`` engine requests a prompt), then add each prompt to the
    engine (under ``lora``'s adapter, if given); if one is refused, abort those added."""
    reservation = admit(state, len(prompts) * n, "n" if n > 1 else prompt_param)
    request_ids: list[str] = []
    streams: list[AsyncIterator[RequestOutput]] = []
    try:
        for p, prompt in enumerate(prompts):
            request_id = state.engine_request_id(api_id, p)
            request_ids.append(request_id)
            stream = await state.llm.add_request(
                request_id, prompt, params.replace(n=n), lora_request=lora
            )
            streams.append(stream)
    except BaseException as exc:
        reservation.close()
        for request_id in request_ids:
            state.llm.abort(request_id)
        if isinstance(exc, ValueError):
            raise invalid_parameter(exc, "prompt") from None
        if isinstance(exc, ENGINE_ERRORS):
            raise engine_error(exc) from None
        raise
    return FanOut(reservation, request_ids, streams, n)


async def merge(
    streams: list[AsyncIterator[RequestOutput]], n: int
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """``(choice index, output)`` from every stream (prompt ``p``'s sample ``i`` is choice
    ``p * n + i``), as they come; leaving early aborts all."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield output.outputs[0].index, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()

    async def pump(prompt: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((prompt * n + output.outputs[0].index, output))
        except Exception as exc:
            queue.put_nowait((prompt, exc))
        queue.put_nowait((prompt, None))

    tasks = [asyncio.create_task(pump(p, s)) for p, s in enumerate(streams)]
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
