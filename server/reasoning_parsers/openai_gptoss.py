"""gpt-oss's reasoning (vLLM's ``openai_gptoss`` parser): the harmony analysis channel;
the final channel (and preambles) are the content. See ``kvserve.server.tool_parsers.harmony``."""

from kvserve.server.reasoning_parsers.base import ParsedReasoning, ReasoningParser
from kvserve.server.tool_parsers.harmony import read_harmony


class GptOssReasoningParser(ReasoningParser):
    reads_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedReasoning:
        out = read_harmony(text, final)
        return ParsedReasoning(out.reasoning, out.content)
