"""How a chat output's text becomes the assistant's message: the server's
``--reasoning-parser`` splits off ``reasoning_content``, the request's tools
(``kvserve.server.chat_tools``) read calls; each reads the whole output, and with tools
the content is the tool-call parser's."""

from dataclasses import dataclass

from kvserve.server.chat_tools import ToolUse
from kvserve.server.reasoning_parsers.base import ReasoningParser, ReasoningStream
from kvserve.server.tool_parsers.base import ToolCallStream


@dataclass(frozen=True)
class ChatReading:
    tools: ToolUse | None
    reasoning: ReasoningParser | None

    @property
    def reads_special_tokens(self) -> bool:
        """Whether the output text keeps its special tokens, in which a format is written."""
        tools = self.tools is not None and self.tools.parser.reads_special_tokens
        return tools or (self.reasoning is not None and self.reasoning.reads_special_tokens)

    def message(self, text: str) -> tuple[dict, bool]:
        """The whole output as an assistant message, and whether it holds calls."""
        called = False
        message: dict = {"role": "assistant", "content": text}
        if self.tools is not None:
            message, called = self.tools.message(text)
        if self.reasoning is not None:
            parsed = self.reasoning.parse(text, final=True)
            if self.tools is None:
                message["content"] = parsed.content or None
            message["reasoning_content"] = parsed.reasoning or None
        return message, called

    def finish_reason(self, engine_reason: str | None, called: bool) -> str | None:
        if self.tools is None:
            return engine_reason
        return self.tools.finish_reason(engine_reason, called)

    def stream(self) -> "ChatStream":
        return ChatStream(self)


class ChatStream:
    """One streamed choice's reading: each ``delta`` brings the output's new text and
    returns the message delta (``reasoning_content``, ``content``, ``tool_calls``)."""

    def __init__(self, reading: ChatReading) -> None:
        tools, reasoning = reading.tools, reading.reasoning
        self.tools: ToolCallStream | None = None if tools is None else tools.stream()
        self.reasoning = None if reasoning is None else ReasoningStream(reasoning)

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.called

    def delta(self, new_text: str, final: bool) -> dict:
        delta: dict = {}
        if self.reasoning is not None:
            new = self.reasoning.delta(new_text, final)
            if new.reasoning:
                delta["reasoning_content"] = new.reasoning
            if self.tools is None and new.content:
                delta["content"] = new.content
        if self.tools is not None:
            delta |= self.tools.delta(new_text, final)
        return delta
