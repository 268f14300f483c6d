"""What every tool-call parser shares: the parse of an output so far, the reading of one
call's JSON object, and the stream of OpenAI ``tool_calls`` deltas.

A parser reads a whole output (``final``) or a prefix of one. Of a prefix it returns only
what the rest of the output cannot change: content that cannot turn out to be the start
of a call, each call's name once it is complete and its arguments as far as they go. So
every parse of a prefix extends the one before, and the deltas of a stream add up to the
parse of the whole output; the one exception is an output that turns out malformed
after a call was streamed (a client cannot unsee a delta).
"""

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

# The head of a call object as models write it: the name first, then the arguments (Llama
# names them "parameters"); the arguments are streamed from where this match ends.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"\s*")


class MalformedToolCall(ValueError):
    """The output is not the format's tool calls: all of it is content."""


@dataclass
class ParsedCall:
    """One tool call: ``name`` (``None`` until known) and its ``arguments``, the JSON text of
    an object (a prefix of it while the call is being written)."""

    name: str | None
    arguments: str = ""


@dataclass
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


class ToolParser(ABC):
    """Reads a model's tool calls out of its output text."""

    reads_special_tokens = False
    """Whether the format is written in special tokens, which the text then keeps."""

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedOutput:
        """The content and calls of ``text``: the whole output if ``final`` (a malformed call
        then makes all of it content, as vLLM does), else a prefix of it (see the module)."""


def skip_whitespace(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]


def held_back(text: str, marker: str) -> int:
    """Where ``text`` stops being certain not to begin ``marker``: its length, less a tail
    that is a proper prefix of the marker."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return len(text) - size
    return len(text)


def read_call(text: str, start: int) -> tuple[ParsedCall, int | None]:
    """The call whose JSON object starts at ``text[start]`` and the index after the object,
    ``None`` while it is incomplete (the call then holds what is known so far).

    ``{"name": str, "arguments" | "parameters": object}``; missing arguments are ``{}``.
    The arguments are the model's own JSON text when it wrote the name first (so that the
    streamed text is the final one), else the object re-encoded. ``MalformedToolCall`` for
    a complete object of another shape."""
    head = _HEAD.match(text, start)
    name = _string(head.group(1)) if head else None
    args_at = head.end() if head and name is not None else -1
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise MalformedToolCall("a tool call nested too deep to read") from None
    except json.JSONDecodeError:
        if args_at < 0 or not text.startswith("{", args_at):
            return ParsedCall(None), None
        try:
            _, args_end = _DECODER.raw_decode(text, args_at)
        except json.JSONDecodeError:
            args_end = len(text)
        return ParsedCall(name, text[args_at:args_end]), None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise MalformedToolCall("a tool call is an object with a string 'name'")
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict):
        raise MalformedToolCall("a tool call's arguments are an object")
    if args_at >= 0 and text.startswith("{", args_at):
        _, args_end = _DECODER.raw_decode(text, args_at)
        return ParsedCall(value["name"], text[args_at:args_end]), end
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False)), end


def read_call_list(
    text: str, pos: int, separator: str, closer: str | None, final: bool
) -> list[ParsedCall]:
    """Calls written one after another from ``pos``, ``separator`` between them, up to
    ``closer`` (or the end of the text when ``None``); whitespace around them is free."""
    calls: list[ParsedCall] = []
    while True:
        pos = skip_whitespace(text, pos)
        if pos == len(text):
            if final:
                raise MalformedToolCall("the output ends where a tool call should be")
            return calls
        if not text.startswith("{", pos):
            raise MalformedToolCall("a tool call is a JSON object")
        call, end = read_call(text, pos)
        calls.append(call)
        if end is None:
            if final:
                raise MalformedToolCall("the output ends inside a tool call")
            return calls
        pos = skip_whitespace(text, end)
        if pos == len(text):
            if final and closer is not None:
                raise MalformedToolCall(f"the tool calls do not end with {closer!r}")
            return calls
        if closer is not None and text.startswith(closer, pos):
            if skip_whitespace(text, pos + len(closer)) != len(text):
                raise MalformedToolCall("text after the tool calls")
            return calls
        if not text.startswith(separator, pos):
            raise MalformedToolCall(f"tool calls are separated by {separator!r}")
        pos += len(separator)


def _string(literal: str) -> str | None:
    try:
        return json.loads(literal)
    except json.JSONDecodeError:
        return None


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(call: ParsedCall) -> dict:
    """A whole call as a message's ``tool_calls`` entry."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": new_tool_call_id(), "type": "function", "function": function}


class ToolCallStream:
    """A growing output as OpenAI chat deltas: ``content`` for the text outside calls, and
    ``tool_calls`` pieces (``index``, with ``id``, ``type`` and the name in a call's first
    piece, then ``arguments`` fragments). With ``parallel`` false only the first call is
    sent, as a non-streamed message keeps only its first. It keeps the output so far: each
    ``delta`` brings the text that is new (the engine's deltas), and the parse is of it all."""

    def __init__(self, parser: ToolParser, parallel: bool) -> None:
        self.parser = parser
        self.parallel = parallel
        self.text = ""
        self.content_sent = 0
        self.arguments_sent: list[int] = []  # per call sent: characters of its arguments

    @property
    def called(self) -> bool:
        return bool(self.arguments_sent)

    def delta(self, new_text: str, final: bool) -> dict:
        """What the output with ``new_text`` (and nothing after it if ``final``) adds to what
        was sent."""
        self.text += new_text
        parsed = self.parser.parse(self.text, final)
        delta: dict = {}
        if len(parsed.content) > self.content_sent:
            delta["content"] = parsed.content[self.content_sent :]
            self.content_sent = len(parsed.content)
        pieces = []
        for index, call in enumerate(parsed.calls[: None if self.parallel else 1]):
            if call.name is None:
                break
            if index == len(self.arguments_sent):
                function = {"name": call.name, "arguments": call.arguments}
                pieces.append(
                    {"index": index, "id": new_tool_call_id(), "type": "function"}
                    | {"function": function}
                )
                self.arguments_sent.append(len(call.arguments))
            elif len(call.arguments) > self.arguments_sent[index]:
                fragment = call.arguments[self.arguments_sent[index] :]
                pieces.append({"index": index, "function": {"arguments": fragment}})
                self.arguments_sent[index] = len(call.arguments)
        if pieces:
            delta["tool_calls"] = pieces
        return delta
