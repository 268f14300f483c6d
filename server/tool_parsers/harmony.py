"""gpt-oss's harmony output as messages: the reading that the ``openai`` tool-call parser
and the ``openai_gptoss`` reasoning parser share.

The model writes messages one after another, with special tokens (kept in the text, so
the requests these parsers read decode with ``skip_special_tokens`` off); here the call's
one line is broken in two::

    <|channel|>analysis<|message|>The user asks ...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
        <|message|>{"city": "Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

A message's header (from ``<|start|>`` or ``<|channel|>`` to ``<|message|>``) names its
channel and, for a call, its recipient (``to=...``, before or after the channel); its body
ends at ``<|end|>``, ``<|return|>`` or ``<|call|>``, or with the output. The analysis
channel is the reasoning; the final channel and commentary without a recipient (a
preamble) are the content; commentary to ``functions.NAME`` is a call of NAME whose
arguments are the body. Messages to other recipients (the built-in ``browser`` and
``python`` tools) are neither. Text before the first header is content.

Of a prefix (``final`` false) the reading holds back what the rest may change: a header
until its ``<|message|>``, and the tail of a body that may begin an end token.
"""

import re
from dataclasses import dataclass, field

from kvserve.server.tool_parsers.base import ParsedCall, held_back

STARTS = ("<|start|>", "<|channel|>")
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
FUNCTIONS = "functions."
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass
class HarmonyOutput:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def read_harmony(text: str, final: bool) -> HarmonyOutput:
    """``text`` (the whole output if ``final``, else a prefix of it) as reasoning, content
    and calls; two analysis messages' reasoning is joined by a newline."""
    out = HarmonyOutput()
    start = _find_first(text, STARTS, 0)
    if start < 0:
        out.content = text if final else text[: _holding(text, STARTS)]
        return out
    out.content = text[:start]
    reasoning: list[str] = []
    while start >= 0:
        body_at = text.find(MESSAGE, start)
        if body_at < 0:
            break  # a header still being written (or cut): nothing of it is known
        header = text[start:body_at]
        body_at += len(MESSAGE)
        end = _find_first(text, ENDS, body_at)
        if end < 0:
            body = text[body_at:] if final else text[body_at : _holding(text, ENDS, body_at)]
        else:
            body = text[body_at:end]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            if recipient.group(1).startswith(FUNCTIONS):
                out.calls.append(ParsedCall(recipient.group(1)[len(FUNCTIONS) :], body.strip()))
        elif channel is not None and channel.group(1) == "analysis":
            reasoning.append(body)
        else:
            out.content += body
        if end < 0:
            break
        start = _find_first(text, STARTS, end)
    out.reasoning = "\n".join(reasoning)
    return out


def _find_first(text: str, markers: tuple[str, ...], pos: int) -> int:
    found = [at for at in (text.find(m, pos) for m in markers) if at >= 0]
    return min(found, default=-1)


def _holding(text: str, markers: tuple[str, ...], pos: int = 0) -> int:
    """Where ``text`` stops being certain not to begin one of ``markers``."""
    return max(pos, min(held_back(text, m) for m in markers))
