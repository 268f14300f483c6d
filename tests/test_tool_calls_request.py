"""Tool calls on the request side, no server needed: the flags, the body checks with vLLM's
messages, what each ``tool_choice`` asks of generation, and the finish reasons."""

import argparse
import json

import pytest

from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.chat_tools import required_schema, template_messages, tool_use
from kvserve.server.cli import build_parser, main, serve_parser
from kvserve.server.errors import APIError
from kvserve.server.protocol.base import parse_body
from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.protocol.tokens import TokenizeRequest
from kvserve.server.tool_parsers.forced import NamedToolParser, RequiredToolParser
from kvserve.server.tool_parsers.hermes import HermesToolParser

MESSAGES = [{"role": "user", "content": "x"}]
POINT = {"type": "object", "properties": {"x": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "move", "parameters": POINT}},
    {"type": "function", "function": {"name": "stop"}},
]


def request(**fields) -> ChatCompletionRequest:
    return parse_body(ChatCompletionRequest, {"messages": MESSAGES, "tools": TOOLS} | fields)


def error(call, *args) -> dict:
    with pytest.raises(APIError) as info:
        call(*args)
    assert info.value.status == 400
    body = info.value.body()["error"]
    assert body["type"] == "invalid_request_error"
    return {"message": body["message"], "param": body["param"]}


def test_flags_are_vllms_and_read_the_environment():
    args = build_parser().parse_args(
        ["serve", "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    )
    assert (args.enable_auto_tool_choice, args.tool_call_parser) == (True, "llama3_json")
    args = build_parser().parse_args(["serve"])
    assert (args.enable_auto_tool_choice, args.tool_call_parser) == (False, None)
    environ = {"KVSERVE_ENABLE_AUTO_TOOL_CHOICE": "true", "KVSERVE_TOOL_CALL_PARSER": "hermes"}
    args = serve_parser(argparse.ArgumentParser(), environ).parse_args([])
    assert (args.enable_auto_tool_choice, args.tool_call_parser) == (True, "hermes")
    with pytest.raises(SystemExit, match="KVSERVE_TOOL_CALL_PARSER must be one of"):
        serve_parser(argparse.ArgumentParser(), {"KVSERVE_TOOL_CALL_PARSER": "mistral"})


def test_auto_tool_choice_without_a_parser_does_not_start(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--enable-auto-tool-choice"])
    assert info.value.code == 2
    assert "--enable-auto-tool-choice requires --tool-call-parser" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        (
            {"tool_choice": "any"},
            'Invalid value for `tool_choice`: any! Only named tools, "none", "auto" or '
            '"required" are supported.',
            "tool_choice",
        ),
        (
            {"tool_choice": {"type": "function"}},
            "Invalid value for `function`: `None` in `tool_choice`! Correct usage: "
            '`{"type": "function", "function": {"name": "my_function"}}`',
            "tool_choice.function",
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": ""}}},
            "Invalid `name` in `function`: `` in `tool_choice`! Correct usage: "
            '`{"type": "function", "function": {"name": "my_function"}}`',
            "tool_choice.function.name",
        ),
        (
            {"messages": [*MESSAGES, {"role": "tool", "content": "r"}]},
            "a 'tool' message needs 'tool_call_id'",
            "messages.1.tool_call_id",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "only 'assistant' messages carry 'tool_calls'",
            "messages.0.tool_calls",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools.0.function.name: String should match pattern '^[A-Za-z0-9_-]+$'",
            "tools.0.function.name",
        ),
    ],
)  # fmt: skip
def test_bad_tool_fields_are_400_naming_them(fields, message, param):
    assert error(lambda: request(**fields)) == {"message": message, "param": param}


def test_each_tool_choice_asks_generation_for_its_own():
    assert tool_use(request(tool_choice="none"), "hermes") is None
    assert tool_use(parse_body(ChatCompletionRequest, {"messages": MESSAGES}), None) is None
    assert error(tool_use, request(), None) == {
        "message": '"auto" tool choice requires --enable-auto-tool-choice and '
        "--tool-call-parser to be set",
        "param": "tool_choice",
    }
    auto = tool_use(request(), "hermes")
    assert isinstance(auto.parser, HermesToolParser) and auto.constraint is None
    required = tool_use(request(tool_choice="required"), None)
    assert isinstance(required.parser, RequiredToolParser)
    assert required.constraint == OutputConstraint("json", json.dumps(required_schema(
        request().tools, parallel=True
    )))  # fmt: skip
    named = tool_use(request(tool_choice={"type": "function", "function": {"name": "move"}}), None)
    assert isinstance(named.parser, NamedToolParser) and named.parser.name == "move"
    assert named.constraint == OutputConstraint("json", json.dumps(POINT))
    bare = tool_use(request(tool_choice={"type": "function", "function": {"name": "stop"}}), None)
    assert bare.constraint == OutputConstraint("json", '{"type": "object", "properties": {}}')


def test_required_schema_is_an_array_of_name_and_parameters():
    def shape(name, parameters):
        return {
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
            "required": ["name", "parameters"],
        }

    empty = {"type": "object", "properties": {}}
    items = {"type": "object", "anyOf": [shape("move", POINT), shape("stop", empty)]}
    assert required_schema(request().tools, parallel=True) == {
        "type": "array",
        "minItems": 1,
        "items": items,
    }
    assert required_schema(request().tools, parallel=False) == {
        "type": "array",
        "minItems": 1,
        "items": items,
        "maxItems": 1,
    }


def test_required_schema_moves_defs_to_the_root():
    ref = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}}
    p = {"type": "integer"}

    def tool(name, defs):
        return {"type": "function", "function": {"name": name, "parameters": ref | {"$defs": defs}}}

    tools = request(tools=[tool("a", {"P": p}), tool("b", {"P": p})]).tools
    schema = required_schema(tools, parallel=True)
    assert schema["$defs"] == {"P": p}
    assert [s["properties"]["parameters"] for s in schema["items"]["anyOf"]] == [ref, ref]
    assert tools[0].function.parameters["$defs"] == {"P": p}  # the request is left as it was
    clash = request(tools=[tool("a", {"P": p}), tool("b", {"P": {"type": "string"}})]).tools
    assert error(required_schema, clash, True) == {
        "message": "the tools define '$defs/P' differently; give each its own name",
        "param": "tools",
    }


def test_finish_reason_is_tool_calls_when_the_output_stopped_with_calls():
    auto = tool_use(request(), "hermes")
    named = tool_use(request(tool_choice={"type": "function", "function": {"name": "move"}}), None)
    assert auto.finish_reason("stop", called=True) == "tool_calls"
    assert auto.finish_reason("stop", called=False) == "stop"
    assert auto.finish_reason("length", called=True) == "length"
    assert auto.finish_reason(None, called=True) is None
    assert named.finish_reason("stop", called=True) == "stop"


def test_a_message_holds_the_calls_and_the_content_before_them():
    auto = tool_use(request(), "hermes")
    message, called = auto.message('Hi\n<tool_call>{"name": "stop", "arguments": {}}</tool_call>')
    assert called and message["content"] == "Hi\n"
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "stop", "arguments": "{}"}]
    message, called = auto.message('<tool_call>{"name": "stop", "arguments": {}}</tool_call>')
    assert called and message["content"] is None
    assert auto.message("") == ({"role": "assistant", "content": ""}, False)
    serial = tool_use(request(parallel_tool_calls=False), "hermes")
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2
    assert len(serial.message(two)[0]["tool_calls"]) == 1


def test_template_messages_carry_calls_with_object_arguments():
    call = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"x": 1}'}}
    body = request(
        messages=[
            *MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ]
    )
    assert template_messages(body.messages) == [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "move", "arguments": {"x": 1}},
                }
            ],
        },
        {"role": "tool", "content": "done", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize(
    "arguments", ["{", "[1]", '{"a": "\\ud800"}', "[" * 100_000, '{"a":' * 40 + "1" + "}" * 40]
)
def test_call_arguments_sent_back_must_be_a_json_object_the_body_could_hold(arguments):
    call = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": arguments}}
    body = request(messages=[{"role": "assistant", "content": None, "tool_calls": [call]}])
    param = "messages.0.tool_calls.0.function.arguments"
    assert error(template_messages, body.messages) == {
        "message": f"{param}: expected the JSON text of an object",
        "param": param,
    }


def test_a_reply_sent_back_as_the_sdk_gave_it_is_taken():
    call = {
        "id": "c1", "type": "function", "index": 0,
        "function": {"name": "move", "arguments": '{"x": 1}', "parsed_arguments": {"x": 1}},
    }  # fmt: skip
    echoed = {"refusal": None, "annotations": None, "audio": None, "function_call": None}
    reply = {"role": "assistant", "content": None, "tool_calls": [call], "parsed": None}
    body = request(messages=[*MESSAGES, reply | echoed])
    assert body.messages[1].tool_calls[0].function.arguments == '{"x": 1}'
    assert error(lambda: request(messages=[reply | {"refusal": "no"}])) == {
        "message": "unknown parameter 'messages.0.refusal'",
        "param": "messages.0.refusal",
    }


def test_tokenize_takes_tools_with_messages_only():
    body = parse_body(TokenizeRequest, {"messages": MESSAGES, "tools": TOOLS})
    assert [t.function.name for t in body.tools] == ["move", "stop"]
    assert error(parse_body, TokenizeRequest, {"prompt": "x", "tools": TOOLS}) == {
        "message": "'tools' are rendered with 'messages' only",
        "param": "tools",
    }
