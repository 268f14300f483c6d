"""The outputs of ``tool_choice`` ``"required"`` and a named function, which structured
outputs hold to a JSON shape (see ``kvserve.server.chat_tools``), as vLLM shapes them:

- required: an array of ``{"name": ..., "parameters": {...}}``, one per call;
- named: the function's arguments object alone, the name being the request's.
"""

from kvserve.server.tool_parsers.base import (
    MalformedToolCall,
    ParsedCall,
    ParsedOutput,
    ToolParser,
    read_call_list,
    skip_whitespace,
)


class RequiredToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        start = skip_whitespace(text, 0)
        if start == len(text) and not final:
            return ParsedOutput("")
        try:
            if not text.startswith("[", start):
                raise MalformedToolCall("the calls are a JSON array")
            return ParsedOutput("", read_call_list(text, start + 1, ",", "]", final))
        except MalformedToolCall:
            return ParsedOutput(text if final else "")


class NamedToolParser(ToolParser):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedOutput:
        """One call: the whole output (without surrounding whitespace) is its arguments."""
        return ParsedOutput("", [ParsedCall(self.name, text.strip())])
