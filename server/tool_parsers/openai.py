"""gpt-oss's calls (vLLM's ``openai`` parser): harmony commentary messages addressed to
``functions.NAME``; the final channel (and preambles) are the content, the analysis
channel is kept out of it. See ``kvserve.server.tool_parsers.harmony``."""

from kvserve.server.tool_parsers.base import ParsedOutput, ToolParser
from kvserve.server.tool_parsers.harmony import read_harmony


class OpenAIToolParser(ToolParser):
    reads_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedOutput:
        out = read_harmony(text, final)
        return ParsedOutput(out.content, out.calls)
