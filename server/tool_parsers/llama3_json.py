"""Llama 3.1+ JSON calls: the output is one or more JSON objects, each
``{"name": ..., "parameters": {...}}``, separated by ``; ``, optionally after
``<|python_tag|>`` (a special token, so usually absent from the text).

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", ...}

As vLLM's ``llama3_json`` parser: an output that does not start with a call (after
whitespace) is content, and one that does but is not calls through to its end is content too.
"""

from kvserve.server.tool_parsers.base import (
    MalformedToolCall,
    ParsedOutput,
    ToolParser,
    read_call_list,
    skip_whitespace,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = skip_whitespace(text, 0)
        if text.startswith(PYTHON_TAG, start):
            start = skip_whitespace(text, start + len(PYTHON_TAG))
        elif not final and PYTHON_TAG.startswith(text[start:]):
            return ParsedOutput("")  # whitespace, or the tag coming: undecided
        if start == len(text) and not final:
            return ParsedOutput("")
        if not text.startswith("{", start):
            return ParsedOutput(text)
        try:
            return ParsedOutput("", read_call_list(text, start, ";", None, final))
        except MalformedToolCall:
            return ParsedOutput(text if final else "")
