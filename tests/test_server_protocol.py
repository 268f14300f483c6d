"""Request bodies: what parses, and the exact 400 for what does not; no server needed."""

import pytest

from kvserve.server.errors import APIError
from kvserve.server.protocol.base import parse_body
from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.protocol.completions import CompletionRequest


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


def test_an_image_content_part_is_a_400_naming_the_part():
    parts = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {}}]
    body = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": parts}]}
    error = _error(ChatCompletionRequest, body)
    assert (error["param"], error["message"]) == (
        "messages.1.content.1",
        "messages.1.content.1: content parts of type 'image_url' are not supported; this "
        "server takes text only",
    )
