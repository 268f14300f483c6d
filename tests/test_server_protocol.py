"""Request bodies, the CLI and its environment, SSE framing: no server needed."""

import asyncio

import pytest

from kvserve.server.admission import Admission
from kvserve.server.cli import build_parser
from kvserve.server.drain import DrainState
from kvserve.server.errors import APIError
from kvserve.server.protocol import ChatCompletionRequest, CompletionRequest, parse_body
from kvserve.server.sse import encode_event


def _error(model, body: dict) -> dict:
    with pytest.raises(APIError) as info:
        parse_body(model, body)
    assert info.value.status == 400
    return info.value.body()["error"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"prompt": "x", "best_of": 2}, "best_of", "'best_of' is not supported by this server"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "'suffix' is not supported by this server"),
        ({"prompt": "x", "typo": 1}, "typo", "unknown parameter 'typo'"),
        ({"prompt": ""}, "prompt", "'prompt' must not be empty"),
        ({"prompt": "x", "n": 0}, "n", "n: Input should be greater than or equal to 1"),
        (
            {"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias",
            "logit_bias key 'a' is not a token id",
        ),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            "stream",
            "'stream_options' is only allowed when 'stream' is true",
        ),
    ],
)  # fmt: skip
def test_completion_body_errors_name_the_parameter(body, param, message):
    error = _error(CompletionRequest, body)
    assert (error["param"], error["message"], error["type"]) == (
        param,
        message,
        "invalid_request_error",
    )


def test_chat_body_rejects_what_it_cannot_do():
    messages = [{"role": "user", "content": "x"}]
    for name in ("tools", "function_call"):
        assert _error(ChatCompletionRequest, {"messages": messages, name: {}})["param"] == name
    error = _error(ChatCompletionRequest, {"messages": messages, "top_logprobs": 2})
    assert error["param"] == "top_logprobs"
    assert _error(ChatCompletionRequest, {"messages": []})["param"] == "messages"


def test_prompts_and_message_parts():
    assert parse_body(CompletionRequest, {"prompt": [1, 2]}).prompts == [[1, 2]]
    assert parse_body(CompletionRequest, {"prompt": ["a", "b"]}).prompts == ["a", "b"]
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    chat = parse_body(ChatCompletionRequest, {"messages": [{"role": "user", "content": parts}]})
    assert chat.messages[0].text == "ab"
    both = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    both["max_completion_tokens"] = 5
    assert parse_body(ChatCompletionRequest, both).max_new_tokens == 5


def test_cli_flag_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("KVSERVE_PORT", "9001")
    monkeypatch.setenv("KVSERVE_API_KEY", "from-env")
    monkeypatch.setenv("KVSERVE_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("KVSERVE_KV_CACHE_MEMORY_GB", "1.5")
    args = build_parser().parse_args(["serve", "--api-key", "from-flag"])
    assert (args.port, args.api_key, args.enable_prefix_caching) == (9001, "from-flag", False)
    assert args.kv_cache_memory_gb == 1.5
    assert build_parser().parse_args(["serve", "--enable-prefix-caching"]).enable_prefix_caching
    monkeypatch.delenv("KVSERVE_PORT")
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.port, defaults.host, defaults.shutdown_timeout) == (8000, "0.0.0.0", 30.0)
    assert (defaults.model, defaults.max_waiting_requests) == (None, None)


def test_bad_environment_values_stop_the_cli(monkeypatch):
    monkeypatch.setenv("KVSERVE_DTYPE", "float8")
    with pytest.raises(SystemExit, match="KVSERVE_DTYPE must be one of auto, float32"):
        build_parser()


def test_sse_frames():
    assert encode_event({"a": "é"}) == 'data: {"a": "é"}\n\n'.encode()
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"


def test_admission_reserves_engine_requests_until_each_is_done():
    admission = Admission(limit=2, batch=4)
    first = admission.reserve(6, "n")  # 4 run, 2 wait
    with pytest.raises(APIError) as full:
        admission.reserve(1, "prompt")
    assert (full.value.status, full.value.headers) == (503, {"Retry-After": "1"})
    assert full.value.code == "server_overloaded"
    first.done(0)
    first.done(0)  # once only
    second = admission.reserve(1, "prompt")
    assert admission.unfinished == 6
    first.close()
    second.close()
    assert admission.unfinished == 0
    with pytest.raises(APIError) as never:
        admission.reserve(7, "n")
    assert (never.value.status, never.value.param) == (400, "n")
    assert Admission(limit=None, batch=1).reserve(1000, "n") is not None


def test_until_cut_ends_an_endless_stream_and_closes_it():
    closed = []

    async def endless():
        try:
            yield 1
            await asyncio.Event().wait()
        finally:
            closed.append(True)

    async def run() -> list[int]:
        drain = DrainState()
        got = []
        async for item in drain.until_cut(endless()):
            got.append(item)
            asyncio.get_running_loop().call_later(0.05, drain.cut)
        return got

    assert asyncio.run(run()) == [1]
    assert closed == [True]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"prompt": [True, 5]}, "prompt",
            "prompt: expected str or list[str] or list[int] or list[list[int]]",
        ),
        (
            {"prompt": "x", "logit_bias": {"٣": 1}}, "logit_bias",
            "logit_bias key '٣' is not a token id",
        ),
        (
            {"prompt": "x", "seed": 2**63}, "seed",
            "seed: Input should be less than or equal to 9223372036854775807",
        ),
        (
            {"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids.0",
            "stop_token_ids.0: Input should be a valid integer",
        ),
        (
            {"prompt": "x", "max_tokens": 5.0}, "max_tokens",
            "max_tokens: Input should be a valid integer",
        ),
        ({"prompt": "x", "n": True}, "n", "n: Input should be a valid integer"),
        ({"prompt": "x", "stream": 1}, "stream", "stream: Input should be a valid boolean"),
    ],
)  # fmt: skip
def test_token_ids_are_strict_and_union_errors_name_the_field(body, param, message):
    error = _error(CompletionRequest, body)
    assert (error["param"], error["message"]) == (param, message)
    assert parse_body(CompletionRequest, {"prompt": "x", "logit_bias": {"007": 1}})
    assert parse_body(CompletionRequest, {"prompt": "x", "seed": -(2**63)}).seed == -(2**63)
