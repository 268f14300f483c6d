"""Reading a JSON request body. However a body is bad (stalled, truncated, not what its
Content-Encoding or charset says, not JSON, nested without end, holding text that is not
Unicode) the client gets an OpenAI-shaped 4xx, never a 500.

Bodies are decompressed here, not by aiohttp (whose decoding errors become plain-text
answers before any handler runs): gzip and deflate, at most ``MAX_BODY_BYTES`` once
decompressed; any other content coding is a 415 that names the ones accepted.
"""

import asyncio
import json
import zlib
from typing import Any

from aiohttp import web

from kvserve.server.errors import APIError, bad_request

MAX_BODY_BYTES = 1024**2  # before and after decompression
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPTED_ENCODINGS = "gzip, deflate"
# JSON nested deeper than this is refused before it reaches validation (no request body
# of this API nests more than 5 levels).
MAX_DEPTH = 32


async def read_json(request: web.Request, timeout: float) -> Any:
    """The body as JSON; 408 if it does not arrive within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s") from None
    except web.RequestPayloadError as exc:
        raise bad_request(f"the request body cannot be read: {_cause(exc)}") from None
    raw = decompress(raw, request.headers.get("Content-Encoding", ""))
    charset = request.charset or "utf-8"
    try:
        text = raw.decode(charset)
    except LookupError:
        raise bad_request(f"unknown charset {charset!r} in Content-Type") from None
    except UnicodeDecodeError:
        raise bad_request(f"the request body is not valid {charset}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise bad_request(f"the request body nests JSON more than {MAX_DEPTH} levels") from None
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    check_json(data)
    return data


def _cause(exc: BaseException) -> str:
    """The innermost message: "Can not decode content-encoding: gzip", not "400, message"."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(getattr(exc, "message", "") or exc).strip() or type(exc).__name__


def decompress(raw: bytes, content_encoding: str) -> bytes:
    """``raw`` with its content codings undone, last applied first."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in _WBITS:
            raise APIError(
                415,
                f"Content-Encoding {coding!r} is not supported; use {ACCEPTED_ENCODINGS}",
                code="unsupported_content_encoding",
                headers={"Accept-Encoding": ACCEPTED_ENCODINGS},
            )
        decoder = zlib.decompressobj(_WBITS[coding])
        try:
            raw_out = decoder.decompress(raw, MAX_BODY_BYTES + 1)
        except zlib.error:
            raise bad_request(f"the request body is not valid {coding} data") from None
        if len(raw_out) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes decompressed")
        if not decoder.eof:
            raise bad_request(f"the request body is truncated {coding} data")
        raw = raw_out
    return raw


def check_json(data: Any) -> None:
    """400 for JSON nested deeper than ``MAX_DEPTH`` or holding a string that is not
    Unicode text (a lone UTF-16 surrogate such as ``"\\ud800"``), naming where."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            param = str(path[0])
            raise bad_request(f"{param}: JSON nested more than {MAX_DEPTH} levels", param)
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, path)


def _check_text(text: str, path: tuple) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        param = ".".join(str(part) for part in path) or None
        where = f"{param}: " if param else ""
        raise bad_request(
            f"{where}the text holds a lone UTF-16 surrogate, which is not a character", param
        ) from None
