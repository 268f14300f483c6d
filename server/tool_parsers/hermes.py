"""Hermes-style calls (Qwen2, Qwen2.5, Qwen3, Hermes 2/3): each call a JSON object in its
own ``<tool_call>`` block; the text before the first block is the content.

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

As vLLM's ``hermes`` parser: text after the first block that is not in a block is dropped,
the last block may lack its ``</tool_call>`` (the model stopped right after the object),
a ``</tool_call>`` ends its block even inside a JSON string, and a block that does not
hold a call makes the whole output content.
"""

from kvserve.server.tool_parsers.base import (
    MalformedToolCall,
    ParsedCall,
    ParsedOutput,
    ToolParser,
    held_back,
    read_call,
    skip_whitespace,
)

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(START)
        if first < 0:
            return ParsedOutput(text if final else text[: held_back(text, START)])
        try:
            return ParsedOutput(text[:first], _blocks(text, first, final))
        except MalformedToolCall:
            return ParsedOutput(text if final else text[:first])


def _blocks(text: str, start: int, final: bool) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    while start >= 0:
        body = skip_whitespace(text, start + len(START))
        close = text.find(END, body)
        stop = len(text) if close < 0 else close
        if body == stop:
            if final or close >= 0:
                raise MalformedToolCall("an empty <tool_call> block")
            return calls
        if not text.startswith("{", body):
            raise MalformedToolCall("a <tool_call> block holds a JSON object")
        call, end = read_call(text[:stop], body)
        calls.append(call)
        if end is None:
            if final or close >= 0:
                raise MalformedToolCall("a <tool_call> block holds an incomplete object")
            return calls
        rest = text[skip_whitespace(text, end) : stop]
        if close < 0:
            if rest and not (END.startswith(rest) and not final):
                raise MalformedToolCall("text after the object in a <tool_call> block")
            return calls
        if rest:
            raise MalformedToolCall("text after the object in a <tool_call> block")
        start = text.find(START, close + len(END))
        if start < 0 and not final:
            return calls  # a block may follow: nothing after this one is content anyway
    return calls
