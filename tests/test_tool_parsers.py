"""Tool-call parsers on exact model-format strings, whole and streamed: the deltas of any
chunking add up to the whole output's parse."""

import itertools
import json
import random

import pytest

from kvserve.server.tool_parsers import TOOL_PARSERS
from kvserve.server.tool_parsers.base import ParsedCall, ParsedOutput, ToolCallStream, ToolParser
from kvserve.server.tool_parsers.forced import NamedToolParser, RequiredToolParser

HERMES = TOOL_PARSERS["hermes"]()
LLAMA = TOOL_PARSERS["llama3_json"]()
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
TIME = '{"name": "get_time", "arguments": {"zone": "CET \\"x\\" <b>"}}'
WEATHER_CALL = ParsedCall("get_weather", '{"city": "Paris", "days": [1, 2]}')
TIME_CALL = ParsedCall("get_time", '{"zone": "CET \\"x\\" <b>"}')


def block(call: str) -> str:
    return f"<tool_call>\n{call}\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Just text.", ParsedOutput("Just text.")),
        (block(WEATHER), ParsedOutput("", [WEATHER_CALL])),
        (
            "Let me look.\n" + block(WEATHER) + "\n" + block(TIME),
            ParsedOutput("Let me look.\n", [WEATHER_CALL, TIME_CALL]),
        ),
        # Text between and after blocks is dropped; the last block may lack its end tag.
        (
            block(WEATHER) + " then " + f"<tool_call>{TIME}\n",
            ParsedOutput("", [WEATHER_CALL, TIME_CALL]),
        ),
        # The name after the arguments: the arguments are re-encoded.
        (
            block('{"arguments": {"a":1}, "name": "f"}'),
            ParsedOutput("", [ParsedCall("f", '{"a": 1}')]),
        ),
        (block('{"name": "f"}'), ParsedOutput("", [ParsedCall("f", "{}")])),
    ],
)  # fmt: skip
def test_hermes_output(text, expected):
    assert HERMES.parse(text, final=True) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Hi " + block("not json"),
        block('{"name": 3, "arguments": {}}'),
        block('{"name": "f", "arguments": "x=1"}'),
        block('["f"]'),
        "<tool_call>\n</tool_call>",
        block(WEATHER) + block('{"name": "f", "arguments": {}} trailing'),
        "<tool_call>\n" + WEATHER[:-3],  # cut off by max_tokens
    ],
)
def test_malformed_hermes_output_is_all_content(text):
    assert HERMES.parse(text, final=True) == ParsedOutput(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            [ParsedCall("get_weather", '{"city": "Paris"}')],
        ),
        (
            ' {"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}\n',
            [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")],
        ),
    ],
)
def test_llama3_json_output(text, expected):
    assert LLAMA.parse(text, final=True) == ParsedOutput("", expected)


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",
        'Here: {"name": "a", "parameters": {}}',
        '{"name": "a", "parameters": {}} and more',
        '{"name": "a", "parameters": {}};',
        '{"name": "a", "parameters": {',
        "",
    ],
)
def test_llama3_json_output_that_is_not_calls_is_content(text):
    assert LLAMA.parse(text, final=True) == ParsedOutput(text)


def test_required_output_is_an_array_of_calls():
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    expected = ParsedOutput("", [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")])
    assert RequiredToolParser().parse(text, final=True) == expected
    cut = text[:30]
    assert RequiredToolParser().parse(cut, final=True) == ParsedOutput(cut)


def test_named_output_is_the_arguments():
    parsed = NamedToolParser("f").parse(' {"x": 1}\n', final=True)
    assert parsed == ParsedOutput("", [ParsedCall("f", '{"x": 1}')])


def test_a_prefix_holds_back_what_may_start_a_call():
    assert HERMES.parse("Sure <tool", final=False) == ParsedOutput("Sure ")
    assert HERMES.parse("Sure <tool", final=True) == ParsedOutput("Sure <tool")
    assert HERMES.parse("a < b", final=False) == ParsedOutput("a < b")
    assert LLAMA.parse("  <|python", final=False) == ParsedOutput("")
    partial = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    assert HERMES.parse(partial, final=False) == ParsedOutput(
        "", [ParsedCall("get_weather", '{"city": "Pa')]
    )
    # The name is sent once it is whole and the arguments follow it.
    assert HERMES.parse('<tool_call>{"name": "get_wea', final=False).calls == [ParsedCall(None)]


def reassemble(parser: ToolParser, text: str, cuts: list[int], parallel: bool = True):
    """Feed ``text`` cut at ``cuts``; the content and calls the deltas add up to."""
    stream = ToolCallStream(parser, parallel)
    content, calls = "", {}
    for start, end in itertools.pairwise([0, *cuts, len(text)]):
        delta = stream.delta(text[start:end], final=end == len(text))
        content += delta.get("content", "")
        for piece in delta.get("tool_calls", []):
            function = piece["function"]
            if piece["index"] not in calls:
                assert piece["id"].startswith("chatcmpl-tool-") and piece["type"] == "function"
                assert piece["index"] == len(calls)
                calls[piece["index"]] = ParsedCall(function["name"], "")
            else:
                assert set(piece) == {"index", "function"} and set(function) == {"arguments"}
            calls[piece["index"]].arguments += function["arguments"]
    return ParsedOutput(content, list(calls.values()))


B_CALL = '{"name": "b", "parameters": {}}'
STREAMED = [
    (HERMES, "Let me look.\n" + block(WEATHER) + "\n" + block(TIME)),
    (HERMES, "No calls < here, <tool_cal but text."),
    (HERMES, "Hi " + block("not json")),
    (HERMES, block('{"arguments": {"a": 1}, "name": "f"}')),
    (LLAMA, '<|python_tag|>{"name": "a", "parameters": {"x": "y; z"}}; ' + B_CALL),
    (LLAMA, "  The answer is 4."),
    (RequiredToolParser(), '[{"name": "a", "parameters": {"x": [1, {"y": 2}]}}, ' + B_CALL + "]"),
    (NamedToolParser("f"), '{"x": {"y": "}"}}'),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "text"), STREAMED)
def test_streamed_character_by_character_equals_the_whole(parser, text):
    assert reassemble(parser, text, list(range(len(text)))) == parser.parse(text, final=True)


@pytest.mark.parametrize(("parser", "text"), STREAMED)
def test_streamed_in_random_chunks_equals_the_whole(parser, text):
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text)), rng.randint(0, min(8, len(text)))))
        assert reassemble(parser, text, cuts) == parser.parse(text, final=True)


def test_without_parallel_calls_only_the_first_is_streamed():
    text = block(WEATHER) + block(TIME)
    assert reassemble(HERMES, text, list(range(len(text))), parallel=False) == ParsedOutput(
        "", [WEATHER_CALL]
    )


def test_streamed_arguments_parse_as_json():
    text = block(WEATHER)
    (call,) = reassemble(HERMES, text, list(range(0, len(text), 3))).calls
    assert json.loads(call.arguments) == {"city": "Paris", "days": [1, 2]}


def test_output_nested_too_deep_to_read_is_content():
    text = block('{"name": "f", "arguments": ' + "[" * 100_000)
    assert HERMES.parse(text, final=True) == ParsedOutput(text)
    assert HERMES.parse(text, final=False) == ParsedOutput("")
