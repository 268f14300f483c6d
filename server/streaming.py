"""A response on the wire: server-sent events as the engine's outputs come, or one JSON body
once every choice finished. However it ends (a client gone, an error, the drain deadline),
no choice is left running and the admission is closed."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from kvserve.engine.core.outputs import RequestOutput
from kvserve.server.errors import unavailable
from kvserve.server.fan_out import ENGINE_ERRORS, FanOut, engine_error, merge
from kvserve.server.protocol.sampling import SamplingBody
from kvserve.server.responses import Choice, Framing, Render, usage
from kvserve.server.sse import DONE, open_event_stream, send_event
from kvserve.server.state import ServerState


@dataclass
class Reply:
    """What one response is made of: the request, its engine requests, how to frame them."""

    state: ServerState
    request: web.Request
    body: SamplingBody
    framing: Framing
    fan: FanOut
    prompt_lens: list[int]
    render: Render
    choices: list[Choice] = field(init=False)

    def __post_init__(self) -> None:
        self.choices = [Choice(i) for i in range(self.fan.num_choices)]

    def receive(self, index: int, output: RequestOutput) -> Choice:
        choice = self.choices[index]
        choice.receive(output)
        if choice.finished:
            self.fan.reservation.done(index)
        return choice


async def respond(reply: Reply) -> web.StreamResponse:
    """Stream the choices as server-sent events, or answer with all of them at the end."""
    try:
        return await _send(reply)
    finally:
        n = reply.fan.n
        for p, request_id in enumerate(reply.fan.request_ids):
            if not all(choice.finished for choice in reply.choices[p * n : p * n + n]):
                reply.state.llm.abort(request_id)
        reply.fan.reservation.close()
        if reply.state.tracer is not None:
            reply.state.tracer.record(reply)


async def _send(reply: Reply) -> web.StreamResponse:
    """The response; at the drain deadline a stream ends with ``finish_reason: "abort"``
    for each unfinished choice and ``[DONE]``, and a whole response becomes a 503."""
    framing, choices = reply.framing, reply.choices
    outputs = reply.state.drain.until_cut(merge(reply.fan.streams, reply.fan.n))
    if not reply.body.stream:
        try:
            async for index, output in outputs:
                reply.receive(index, output)
        except ENGINE_ERRORS as exc:
            raise engine_error(exc) from None
        if not all(choice.finished for choice in choices):
            raise unavailable("the server shut down before this request finished; retry it")
        rendered = [reply.render(choice, False) for choice in choices]
        whole = framing.envelope(rendered, chunk=False)
        return web.json_response(whole | {"usage": usage(reply.prompt_lens, choices)})
    response = await open_event_stream(reply.request)
    try:
        await _stream(reply, outputs, response)
    except ENGINE_ERRORS as exc:  # an error event, then [DONE], as vLLM ends a failed stream
        await send_event(response, engine_error(exc).body())
        await send_event(response, DONE)
        await response.write_eof()
        return response
    for choice in choices:
        if not choice.finished:
            await send_event(response, framing.envelope([framing.cut_piece(choice)], chunk=True))
    if reply.body.include_usage:
        last = {"usage": usage(reply.prompt_lens, choices)}
        await send_event(response, framing.envelope([], chunk=True) | last)
    await send_event(response, DONE)
    await response.write_eof()
    return response


async def _stream(
    reply: Reply,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    response: web.StreamResponse,
) -> None:
    """Each choice's pieces as events, as the engine's outputs come."""
    body = reply.body
    options = body.stream_options
    async for index, output in outputs:
        piece = reply.render(reply.receive(index, output), True)
        if piece is None:
            continue
        chunk = reply.framing.envelope([piece], chunk=True)
        if options is not None and options.continuous_usage_stats:
            chunk["usage"] = usage(reply.prompt_lens, reply.choices)
        elif body.include_usage:
            chunk["usage"] = None
        await send_event(response, chunk)
