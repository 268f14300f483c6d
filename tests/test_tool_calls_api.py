"""Tool calls through a real ``kvserve serve`` (a Hermes-style template, ``--tool-call-parser
hermes``), driven by the official SDK: ``required`` and a named function always produce a
call that validates, streamed calls reassemble in the SDK, tool results render into the
next turn, and ``auto`` parses a crafted Hermes output."""

import json

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from checkpoints import TOOL_CHAT_TEMPLATE, build_checkpoint
from server_process import API_KEY, ServerProcess

CITY = {"enum": ["Paris", "Tokyo", "Lima"]}
WEATHER = {
    "type": "object",
    "properties": {"city": CITY, "metric": {"type": "boolean"}},
    "required": ["city", "metric"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["CET", "UTC"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
GET_TIME = {"type": "function", "function": {"name": "get_time"}}
CRAFTED = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Lima", "metric": true}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools-model")
    return build_checkpoint(
        "qwen2", path, chat_template=TOOL_CHAT_TEMPLATE, max_position_embeddings=2048
    )


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("tools-server") / "server.log"
    args = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--num-kv-blocks", "256")
    with ServerProcess(model_dir, *args, log=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def chat(client, **kwargs):
    args = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200) | kwargs
    return client.chat.completions.create(**args)


def assert_valid_call(call) -> None:
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_required_always_makes_one_valid_call(client, seed):
    temperature = 0 if seed is None else 1.0
    result = chat(
        client,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=temperature,
        seed=seed,
    )
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert_valid_call(call)


def test_a_named_function_is_called_and_finishes_with_stop(client):
    for seed in range(3):
        choice = chat(client, tool_choice=GET_TIME, temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "stop"  # as OpenAI reports a named function
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_time"
        assert_valid_call(call)


@pytest.mark.parametrize("tool_choice", ["required", GET_TIME], ids=["required", "named"])
def test_streamed_call_is_reassembled_by_the_sdk_as_the_whole_one(client, tool_choice):
    args = dict(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
        tool_choice=tool_choice, parallel_tool_calls=False,
    )  # fmt: skip
    whole = client.chat.completions.create(**args).choices[0]
    with client.chat.completions.stream(**args) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_completion().choices[0]
    assert events.count("tool_calls.function.arguments.delta") > 1
    assert "tool_calls.function.arguments.done" in events
    assert streamed.finish_reason == whole.finish_reason
    (call,) = streamed.message.tool_calls
    assert_valid_call(call)
    assert call.function.model_dump() | {"parsed_arguments": None} == (
        whole.message.tool_calls[0].function.model_dump() | {"parsed_arguments": None}
    )


def test_tool_result_renders_into_the_next_turn(client, server, model_dir):
    with client.chat.completions.stream(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
        tool_choice="required", parallel_tool_calls=False,
    ) as stream:  # fmt: skip
        message = stream.get_final_completion().choices[0].message
    call = message.tool_calls[0]
    messages = [
        *MESSAGES,
        message,  # the SDK's own object (with its parsed fields), sent back as it came
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"},
    ]
    second = chat(client, messages=messages, tool_choice="none", max_tokens=4)
    assert second.choices[0].message.tool_calls is None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    arguments = json.loads(call.function.arguments)
    text = tokenizer.apply_chat_template(
        [
            *MESSAGES,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": call.function.name, "arguments": arguments}}],
            },
            {"role": "tool", "content": "sunny, 21 degrees"},
        ],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}'
        "\n</tool_call>\n<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 21 degrees\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert second.usage.prompt_tokens == len(expected)
    sent = [*MESSAGES, message.model_dump(exclude_none=True), messages[-1]]
    tokenized = server.post("/tokenize", {"messages": sent, "tools": TOOLS})
    assert tokenized["tokens"] == expected


def test_tools_are_rendered_into_the_prompt_by_the_template(server, model_dir):
    tokens = server.post("/tokenize", {"messages": MESSAGES, "tools": TOOLS[1:]})["tokens"]
    assert AutoTokenizer.from_pretrained(model_dir).decode(tokens) == (
        "<|im_start|>system\nYou may call these functions:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", '
        '"properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"], '
        '"additionalProperties": false}}}\n</tools>\nCall one as <tool_call>\n'
        '{"name": <function name>, "arguments": <arguments object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_auto_parses_a_hermes_output(client):
    # Structured outputs make the tiny model write exactly the crafted Hermes output.
    crafted = {"structured_outputs": {"choice": [CRAFTED]}}
    choice = chat(client, tool_choice="auto", extra_body=crafted).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look.\n"
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == (
        "get_weather",
        '{"city": "Lima", "metric": true}',
    )
    with client.chat.completions.stream(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, extra_body=crafted
    ) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert streamed.message.content == "Let me look.\n"
    assert streamed.message.tool_calls[0].function.arguments == call.function.arguments


def test_auto_without_calls_is_plain_content(client):
    choice = chat(client, max_tokens=5, temperature=0).choices[0]
    assert (choice.message.tool_calls, choice.finish_reason) == (None, "length")
    plain = chat(client, max_tokens=5, temperature=0, tool_choice="none").choices[0]
    assert choice.message.content == plain.message.content


def error(client, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, **kwargs)
    return info.value.body


def invalid(message: str, param: str | None) -> dict:
    return {"message": message, "type": "invalid_request_error", "param": param, "code": None}


def test_tool_errors_are_400_with_vllm_messages(client):
    assert error(client, tool_choice={"type": "function", "function": {"name": "nope"}}) == invalid(
        "The tool specified in `tool_choice` does not match any of the specified `tools`",
        "tool_choice",
    )
    assert error(client, tools=[]) == invalid(
        "`tools` must not be an empty array. Either provide at least one tool or omit the "
        "field entirely.",
        "tools",
    )
    assert error(client, tools=None, tool_choice="required") == invalid(
        "When using `tool_choice`, `tools` must be set.", "tool_choice"
    )
    assert error(client, tool_choice=GET_TIME, extra_body={"guided_regex": "a+"}) == invalid(
        "You can only either use constraints for structured outputs or tools, not both.",
        "tool_choice",
    )
    bad_call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{"}}
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [bad_call]}]
    assert error(client, messages=messages) == invalid(
        "messages.1.tool_calls.0.function.arguments: expected the JSON text of an object",
        "messages.1.tool_calls.0.function.arguments",
    )
    unusable = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]
    body = error(client, tools=unusable, tool_choice="required")
    assert (body["param"], body["type"]) == ("tools", "invalid_request_error")
    assert body["message"].startswith("tools: invalid json schema")


@pytest.fixture(scope="module")
def llama_client(model_dir, tmp_path_factory):
    """A server choosing its parser through the environment, as the operator's pods may."""
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KVSERVE_ENABLE_AUTO_TOOL_CHOICE", "true")
        env.setenv("KVSERVE_TOOL_CALL_PARSER", "llama3_json")
        with ServerProcess(model_dir, "--num-kv-blocks", "128", log=log) as s:
            yield openai.OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0)


def test_auto_parses_llama3_json_calls(llama_client):
    crafted = (
        '{"name": "get_time", "parameters": {"zone": "UTC"}}; '
        '{"name": "get_weather", "parameters": {"city": "Paris", "metric": false}}'
    )
    extra = {"extra_body": {"structured_outputs": {"choice": [crafted]}}}
    choice = chat(llama_client, **extra).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert calls == [
        ("get_time", '{"zone": "UTC"}'),
        ("get_weather", '{"city": "Paris", "metric": false}'),
    ]
    args = dict(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, **extra)
    with llama_client.chat.completions.stream(**args) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == calls
    assert streamed.finish_reason == "tool_calls"
    serial = chat(llama_client, parallel_tool_calls=False, **extra).choices[0]
    assert [c.function.name for c in serial.message.tool_calls] == ["get_time"]


def test_a_streamed_call_sends_every_tokens_logprobs(client):
    chunks = list(
        chat(
            client, tool_choice="required", parallel_tool_calls=False, temperature=0,
            logprobs=True, stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(entries) == chunks[-1].usage.completion_tokens
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert pieces[0].function.name in SCHEMAS and len(pieces) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
