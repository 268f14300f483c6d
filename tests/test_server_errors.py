"""Hostile bodies and requests against a real server: each gets its exact OpenAI-shaped 4xx."""

import gzip
import json
import zlib

import pytest

from server_process import ServerProcess

JSON = {"Content-Type": "application/json"}
SURROGATE = "the text holds a lone UTF-16 surrogate, which is not a character"
PROMPT_TYPES = "prompt: expected str or list[str] or list[int] or list[list[int]]"


def error(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ServerProcess(checkpoint("llama"), "--num-kv-blocks", "64", log=log) as s:
        yield s


def _completion(**fields) -> bytes:
    return json.dumps({"prompt": "x", "max_tokens": 1} | fields).encode()


def _post(server, path: str, data: bytes, **headers: str) -> tuple[int, dict]:
    status, _, body = server.send(path, data, JSON | headers)
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("path", "data", "param"),
    [
        ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
        ("/v1/completions", b'{"prompt": ["ok", "a\\udfffb"]}', "prompt.1"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages.0.content",
        ),
        ("/tokenize", b'{"prompt": "a\\ud800b"}', "prompt"),
        ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud800"]}', "stop.0"),
    ],
)
def test_a_lone_surrogate_is_400_naming_where(server, path, data, param):
    assert _post(server, path, data) == (400, error(f"{param}: {SURROGATE}", param))


def test_json_nested_without_end_is_400(server):
    deep = b"[" * 5000 + b"]" * 5000
    assert _post(server, "/v1/completions", deep) == (
        400,
        error("the request body nests JSON more than 32 levels"),
    )
    nested = b'{"prompt": ' + b"[" * 40 + b"]" * 40 + b"}"
    assert _post(server, "/v1/completions", nested) == (
        400,
        error("prompt: JSON nested more than 32 levels", "prompt"),
    )


CHARSET = "application/json; charset="


@pytest.mark.parametrize(
    ("headers", "data", "message"),
    [
        ({"Content-Type": CHARSET + "klingon"}, b"{}", "unknown charset 'klingon' in Content-Type"),
        ({"Content-Type": CHARSET + "utf-16"}, b"{}\n", "the request body is not valid utf-16"),
        ({"Content-Encoding": "gzip"}, b"{}", "the request body is not valid gzip data"),
        ({"Content-Encoding": "deflate"}, b"{}", "the request body is not valid deflate data"),
        (
            {"Content-Encoding": "gzip"},
            gzip.compress(b'{"prompt": "x"}')[:-9],
            "the request body is truncated gzip data",
        ),
    ],
)
def test_bodies_that_do_not_decode_are_400(server, headers, data, message):
    assert _post(server, "/v1/completions", data, **headers) == (400, error(message))


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, br"])
def test_unsupported_content_codings_are_415_naming_the_accepted_ones(server, coding):
    status, headers, body = server.send(
        "/v1/completions", _completion(), JSON | {"Content-Encoding": coding}
    )
    name = coding.split(", ")[-1]
    assert (status, headers["Accept-Encoding"], json.loads(body)) == (
        415,
        "gzip, deflate",
        {
            "error": {
                "message": f"Content-Encoding {name!r} is not supported; use gzip, deflate",
                "type": "invalid_request_error",
                "param": None,
                "code": "unsupported_content_encoding",
            }
        },
    )


@pytest.mark.parametrize(
    ("coding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate, gzip", lambda data: gzip.compress(zlib.compress(data))),
        ("identity", bytes),
    ],
)
def test_compressed_bodies_are_decoded(server, coding, compress):
    data = compress(_completion())
    status, answer = _post(server, "/v1/completions", data, **{"Content-Encoding": coding})
    assert status == 200
    assert answer["usage"]["completion_tokens"] == 1


def test_a_body_that_decompresses_past_the_limit_is_413(server):
    bomb = gzip.compress(b" " * (4 * 1024 * 1024))
    status, answer = _post(server, "/v1/completions", bomb, **{"Content-Encoding": "gzip"})
    assert (status, answer) == (413, error("the request body is over 1048576 bytes decompressed"))


def test_wrong_method_and_oversized_body_have_openai_types(server):
    status, headers, body = server.send("/v1/completions", None, method="GET")
    assert (status, headers["Allow"]) == (405, "POST")
    assert json.loads(body) == error("GET is not allowed on /v1/completions; use POST")
    status, answer = _post(server, "/v1/completions", b" " * (1024 * 1024 + 1))
    assert (status, answer) == (
        413,
        error("the request body is too large: Maximum request body size 1048576 exceeded."),
    )
    status, _, body = server.send("/v1/nothing", b"{}")
    assert (status, json.loads(body)) == (404, error("Not Found", kind="not_found_error"))


LONG_KEY = "9" * 5000  # past the digits int() converts


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"prompt": [True, 5]}, PROMPT_TYPES, "prompt"),
        ({"prompt": [5.0, 5]}, PROMPT_TYPES, "prompt"),
        ({"prompt": [[5, False]]}, PROMPT_TYPES, "prompt"),
        (
            {"stop_token_ids": [1.0]},
            "stop_token_ids.0: Input should be a valid integer",
            "stop_token_ids.0",
        ),
        ({"logit_bias": {"٣": 1}}, "logit_bias key '٣' is not a token id", "logit_bias"),
        ({"logit_bias": {"--3": 1}}, "logit_bias key '--3' is not a token id", "logit_bias"),
        (
            {"logit_bias": {LONG_KEY: 1}},
            f"logit_bias key {LONG_KEY!r} is not a token id",
            "logit_bias",
        ),
        (
            {"seed": 2**64},
            "seed: Input should be less than or equal to 9223372036854775807",
            "seed",
        ),
        ({"stop": 5}, "stop: expected str or list[str]", "stop"),
    ],
    ids=lambda value: str(value)[:30],
)
def test_strict_token_ids_and_the_param_of_every_400(server, fields, message, param):
    assert _post(server, "/v1/completions", _completion(**fields)) == (400, error(message, param))


def test_chat_content_of_the_wrong_type_names_the_message(server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    message = "messages.0.content: expected str or list[TextPart]"
    data = json.dumps(body).encode()
    assert _post(server, "/v1/chat/completions", data) == (
        400,
        error(message, "messages.0.content"),
    )
    status, _, body = server.send("/detokenize", b'{"tokens": [true]}', JSON)
    assert (status, json.loads(body)) == (
        400,
        error("tokens.0: Input should be a valid integer", "tokens.0"),
    )
