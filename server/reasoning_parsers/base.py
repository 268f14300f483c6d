"""What every reasoning parser shares: the split of an output so far into reasoning and
content, and the stream of its ``reasoning_content`` and ``content`` deltas.

As with tool-call parsers (``kvserve.server.tool_parsers.base``), the parse of a prefix
holds only what the rest of the output cannot change, so that the deltas of a stream add
up to the parse of the whole output. A request that also reads tool calls takes its
content from the tool-call parser, which reads the whole output too.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass
class ParsedReasoning:
    reasoning: str
    content: str


class ReasoningParser(ABC):
    reads_special_tokens = False
    """Whether the format is written in special tokens, which the text then keeps."""

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedReasoning:
        """The reasoning and content of ``text``: the whole output if ``final``, else a
        prefix of it."""


class ReasoningStream:
    """A growing output as ``reasoning_content`` and ``content`` deltas; each ``delta``
    brings the text that is new, and the parse is of it all."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = ParsedReasoning("", "")

    def delta(self, new_text: str, final: bool) -> ParsedReasoning:
        """What the output with ``new_text`` (and nothing after it if ``final``) adds."""
        self.text += new_text
        parsed = self.parser.parse(self.text, final)
        new = ParsedReasoning(
            parsed.reasoning[len(self.sent.reasoning) :], parsed.content[len(self.sent.content) :]
        )
        self.sent = parsed
        return new
