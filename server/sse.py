"""Server-sent events as the OpenAI streaming API frames them: ``data: <json>`` blocks,
closed by ``data: [DONE]``."""

import json

from aiohttp import web

DONE = "[DONE]"


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response


def encode_event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def send_event(response: web.StreamResponse, payload: dict | str) -> None:
    await response.write(encode_event(payload))
