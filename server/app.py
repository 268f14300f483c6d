"""The aiohttp application: routes, API-key check, request ids, drain gate, error shape."""

import logging
import time
import uuid
from importlib.metadata import version

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kvserve.server.body import MAX_BODY_BYTES, read_json
from kvserve.server.endpoints import create_chat_completion, create_completion
from kvserve.server.errors import APIError, bad_request, unavailable
from kvserve.server.lora_endpoints import load_lora_adapter, unload_lora_adapter
from kvserve.server.openapi import openapi_document
from kvserve.server.protocol.base import parse_body
from kvserve.server.protocol.tokens import DetokenizeRequest, TokenizeRequest
from kvserve.server.request_params import chat_prompt_ids, check_model
from kvserve.server.state import REQUEST_ID, ServerState

log = logging.getLogger(__name__)

STATE = web.AppKey("state", ServerState)
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version", "/openapi.json"})
# The engine loop counts as stalled when requests are unfinished and no step ended for this long.
STALL_SECONDS = 60.0


def _state(request: web.Request) -> ServerState:
    return request.app[STATE]


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    request[REQUEST_ID] = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(request, exc).response()
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return APIError(500, "internal server error").response()


def _http_error(request: web.Request, exc: web.HTTPException) -> APIError:
    """aiohttp's own 4xx (no route, wrong method, body too large) in OpenAI's shape."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return APIError(413, f"the request body is too large: {exc.text}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = exc.headers["Allow"]
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        return APIError(405, message, headers={"Allow": allowed})
    return APIError(exc.status, exc.reason)


@web.middleware
async def gate_middleware(request: web.Request, handler) -> web.StreamResponse:
    """API key, then the drain gate; tracks admitted requests until their last byte."""
    state = _state(request)
    if request.path in OPEN_PATHS:
        return await handler(request)
    key = state.api_key
    if key is not None and request.headers.get("Authorization", "") != f"Bearer {key}":
        raise APIError(401, "missing or invalid API key", code="invalid_api_key")
    if not state.drain.ready:
        raise unavailable("the server is shutting down and takes no new requests")
    with state.drain.track():
        return await handler(request)


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    if REQUEST_ID in request:
        response.headers["X-Request-Id"] = request[REQUEST_ID]


async def completions(request: web.Request) -> web.StreamResponse:
    return await create_completion(_state(request), request)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await create_chat_completion(_state(request), request)


async def models(request: web.Request) -> web.Response:
    state = _state(request)
    card = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "kvserve",
        "root": state.model_path,
        "max_model_len": state.llm.max_model_len,
    }
    adapters = [
        {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "kvserve",
            "root": served.request.lora_path,
            "parent": served.parent,
            "max_model_len": state.llm.max_model_len,
        }
        for name, served in state.loras.by_name.items()
    ]
    return web.json_response({"object": "list", "data": [card, *adapters]})


async def load_lora(request: web.Request) -> web.Response:
    return await load_lora_adapter(_state(request), request)


async def unload_lora(request: web.Request) -> web.Response:
    return await unload_lora_adapter(_state(request), request)


async def tokenize(request: web.Request) -> web.Response:
    state = _state(request)
    body = parse_body(TokenizeRequest, await read_json(request, state.body_timeout))
    check_model(state, body.model)
    if body.messages is not None:
        tokens = chat_prompt_ids(state, body.messages, body.add_generation_prompt, body.tools)
    else:
        tokens = state.llm.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    limit = state.llm.max_model_len
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": limit})


async def detokenize(request: web.Request) -> web.Response:
    state = _state(request)
    body = parse_body(DetokenizeRequest, await read_json(request, state.body_timeout))
    check_model(state, body.model)
    vocab = len(state.llm.tokenizer)
    if any(not 0 <= t < vocab for t in body.tokens):
        raise bad_request(f"token ids must be in [0, {vocab})", "tokens")
    return web.json_response({"prompt": state.llm.tokenizer.decode(body.tokens)})


async def health(request: web.Request) -> web.Response:
    """Alive while the engine loop runs and, with work to do, keeps finishing steps."""
    llm = _state(request).llm
    stalled = llm.num_unfinished > 0 and time.monotonic() - llm.last_progress > STALL_SECONDS
    if not llm.is_alive or stalled:
        return web.json_response({"status": "engine not making progress"}, status=503)
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """Ready once loaded, until draining starts or the engine dies."""
    state = _state(request)
    drain = state.drain
    if drain.ready and state.llm.error is not None:
        return web.json_response({"status": "engine dead"}, status=503)
    if drain.ready:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "draining" if drain.draining else "loading"}, status=503)


async def metrics(request: web.Request) -> web.Response:
    """The latest snapshot: a scrape never formats the registry nor waits on the engine."""
    body = _state(request).metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _start_metrics(app: web.Application) -> None:
    app[STATE].metrics.snapshot.start()


async def _stop_metrics(app: web.Application) -> None:
    app[STATE].metrics.snapshot.stop()


async def version_info(request: web.Request) -> web.Response:
    return web.json_response({"version": version("kvserve")})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(version("kvserve")))


def build_app(state: ServerState) -> web.Application:
    app = web.Application(
        middlewares=[errors_middleware, gate_middleware], client_max_size=MAX_BODY_BYTES
    )
    app[STATE] = state
    app.on_response_prepare.append(_echo_request_id)
    app.on_startup.append(_start_metrics)
    app.on_cleanup.append(_stop_metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    if state.allow_runtime_lora_updating:
        app.router.add_post("/v1/load_lora_adapter", load_lora)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version_info)
    app.router.add_get("/openapi.json", openapi)
    return app
