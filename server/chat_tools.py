"""Tools on the chat endpoint: into the prompt through the chat template, and out of the
output as ``tool_calls``, decided per request as vLLM's OpenAI server decides them.

- ``"none"``: the tools are in the prompt, the output is plain content.
- ``"auto"``: the server's ``--tool-call-parser`` reads calls out of free output (a 400
  unless the server runs with ``--enable-auto-tool-choice`` and a parser).
- ``"required"``: structured outputs hold the output to a JSON array of one call or more
  (one at most without ``parallel_tool_calls``), each ``{"name", "parameters"}`` of a tool.
- a named function: the output is held to that function's parameters schema, and is the
  one call's arguments.

``finish_reason`` is ``"tool_calls"`` when the output stopped with calls, except for a named
function, which OpenAI reports as ``"stop"``; an output cut by ``max_tokens`` is
``"length"`` whatever it holds.
"""

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvserve.engine.structured.compiler import GrammarCompiler
from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.body import check_json
from kvserve.server.errors import APIError, bad_request
from kvserve.server.protocol.chat import ChatCompletionRequest, ChatMessage, NamedToolChoice, Tool
from kvserve.server.structured import check_compiles, checked_constraint
from kvserve.server.tool_parsers import TOOL_PARSERS
from kvserve.server.tool_parsers.base import ToolCallStream, ToolParser, tool_call
from kvserve.server.tool_parsers.forced import NamedToolParser, RequiredToolParser

AUTO_NEEDS_PARSER = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
_NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    """How one request's output becomes tool calls."""

    parser: ToolParser
    constraint: OutputConstraint | None  # for "required" and a named function
    parallel: bool
    named: bool

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.parser, self.parallel)

    def message(self, text: str) -> tuple[dict, bool]:
        """The whole output as an assistant message, and whether it holds calls."""
        parsed = self.parser.parse(text, final=True)
        calls = parsed.calls[: None if self.parallel else 1]
        content = parsed.content if parsed.content or not calls else None
        message: dict = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [tool_call(call) for call in calls]
        return message, bool(calls)

    def finish_reason(self, engine_reason: str | None, called: bool) -> str | None:
        if engine_reason == "stop" and called and not self.named:
            return "tool_calls"
        return engine_reason


def tool_use(body: ChatCompletionRequest, auto_parser: str | None) -> ToolUse | None:
    """The request's ``ToolUse``, ``None`` when its output is plain content; a 400 for
    ``"auto"`` on a server without a parser."""
    choice = body.effective_tool_choice
    tools = body.tools or []
    if choice == "none":
        return None
    if choice == "auto":
        if auto_parser is None:
            raise bad_request(AUTO_NEEDS_PARSER, "tool_choice")
        return ToolUse(TOOL_PARSERS[auto_parser](), None, body.parallel_tool_calls, False)
    if choice == "required":
        schema = required_schema(tools, body.parallel_tool_calls)
        constraint = OutputConstraint("json", json.dumps(schema))
        return ToolUse(RequiredToolParser(), constraint, body.parallel_tool_calls, False)
    assert isinstance(choice, NamedToolChoice)
    name = choice.function.name
    (tool,) = (t for t in tools if t.function.name == name)
    constraint = OutputConstraint("json", json.dumps(tool.function.parameters or _NO_PARAMETERS))
    return ToolUse(NamedToolParser(name), constraint, True, True)


def required_schema(tools: list[Tool], parallel: bool) -> dict:
    """The JSON schema of ``"required"`` calls: an array of ``{"name", "parameters"}``
    objects, one shape per tool. The tools' ``$defs`` move to the root, where their
    ``$ref``s point; two tools defining one name differently are a 400."""
    defs: dict = {}
    shapes = []
    for tool in tools:
        parameters = copy.deepcopy(tool.function.parameters or _NO_PARAMETERS)
        defs_here = parameters.pop("$defs", {})
        if not isinstance(defs_here, dict):
            raise bad_request(
                f"tools: the '$defs' of '{tool.function.name}' are not an object", "tools"
            )
        for key, definition in defs_here.items():
            if defs.setdefault(key, definition) != definition:
                raise bad_request(
                    f"the tools define '$defs/{key}' differently; give each its own name",
                    "tools",
                )
        shapes.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": shapes}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def template_tools(tools: list[Tool] | None) -> list[dict | Callable[..., Any]] | None:
    """The tools as chat templates take them (``tools=``): OpenAI's JSON shape."""
    return None if tools is None else [t.model_dump(exclude_none=True) for t in tools]


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The conversation as chat templates take it. Calls carry their arguments as objects,
    as the Hugging Face templates expect them; arguments that are not a JSON object are a
    400 naming them."""
    turns = []
    for i, message in enumerate(messages):
        turn: dict = {"role": message.role, "content": message.text}
        if message.tool_calls is not None:
            turn["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments(call.function.arguments, f"{i}.tool_calls.{j}"),
                    },
                }
                for j, call in enumerate(message.tool_calls)
            ]
        if message.tool_call_id is not None:
            turn["tool_call_id"] = message.tool_call_id
        turns.append(turn)
    return turns


def _arguments(text: str, where: str) -> dict:
    param = f"messages.{where}.function.arguments"
    try:
        arguments = json.loads(text)
        check_json(arguments)  # what the body itself may not hold, its arguments may not
    except (ValueError, RecursionError, APIError):
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request(f"{param}: expected the JSON text of an object", param)
    return arguments


async def chat_constraint(
    grammars: GrammarCompiler, body: ChatCompletionRequest, tools: ToolUse | None
) -> OutputConstraint | None:
    """The request's output constraint: its structured-output one or its tools' (vLLM takes
    not both); 400 if it does not compile."""
    asked = await checked_constraint(grammars, body)
    if tools is None or tools.constraint is None:
        return asked
    if asked is not None:
        raise bad_request(
            "You can only either use constraints for structured outputs or tools, not both.",
            "tool_choice",
        )
    await check_compiles(grammars, tools.constraint, "tools")
    return tools.constraint
