"""``/v1/chat/completions``' body: messages, tools and the tool choice."""

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from kvserve.server.errors import bad_request
from kvserve.server.protocol.base import Body
from kvserve.server.protocol.sampling import MAX_LOGPROBS, SamplingBody


class TextPart(Body):
    type: Literal["text"]
    text: str


def _without(data: Any, echoed: dict[str, Callable[[Any], bool]]) -> Any:
    """``data`` without the response fields the SDK's own objects carry when an agent sends
    a reply back as it got it (``messages.append(completion.choices[0].message)``), where
    ``echoed[name](value)`` says the field adds nothing to what is sent anyway."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if not (k in echoed and echoed[k](v))}
    return data


def _anything(_: Any) -> bool:
    return True


def _null(value: Any) -> bool:
    return value is None


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed(cls, data: Any) -> Any:
        return _without(data, {"parsed_arguments": _anything})  # the SDK's parse of arguments


class ToolCallParam(Body):
    """A call an earlier assistant turn made, as the client sends it back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed(cls, data: Any) -> Any:
        return _without(data, {"index": lambda v: isinstance(v, int)})  # a streamed call's


class FunctionDefinition(Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments object
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call this is the result of

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed(cls, data: Any) -> Any:
        nulls = dict.fromkeys(("refusal", "annotations", "audio", "function_call"), _null)
        return _without(data, nulls | {"parsed": _anything})  # "parsed": the SDK's of content

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingBody):
    UNSUPPORTED = (
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "web_search_options",
        "reasoning_effort",
        "best_of",
    )

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
        return self

    @model_validator(mode="before")
    @classmethod
    def _check_content_parts(cls, data: Any) -> Any:
        """A content part that is not text (an image, audio, a file) is a 400 naming it: the
        engine serves text models (of an image-text checkpoint, its language model)."""
        messages = data.get("messages") if isinstance(data, dict) else None
        for i, message in enumerate(messages if isinstance(messages, list) else []):
            content = message.get("content") if isinstance(message, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else []):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    where = f"messages.{i}.content.{j}"
                    raise bad_request(
                        f"{where}: content parts of type {kind!r} are not supported; this "
                        "server takes text only",
                        where,
                    )
        return data

    @model_validator(mode="before")
    @classmethod
    def _check_tool_choice_shape(cls, data: Any) -> Any:
        """vLLM's messages for a ``tool_choice`` that is neither a mode nor a named function."""
        choice = data.get("tool_choice") if isinstance(data, dict) else None
        if isinstance(choice, str) and choice not in ("none", "auto", "required"):
            raise bad_request(
                f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                '"none", "auto" or "required" are supported.',
                "tool_choice",
            )
        if isinstance(choice, dict):
            function = choice.get("function")
            if not isinstance(function, dict):
                raise bad_request(
                    f"Invalid value for `function`: `{function}` in `tool_choice`! " + _NAMED_USAGE,
                    "tool_choice.function",
                )
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise bad_request(
                    f"Invalid `name` in `function`: `{name}` in `tool_choice`! " + _NAMED_USAGE,
                    "tool_choice.function.name",
                )
        return data

    @model_validator(mode="after")
    def _check_tools(self) -> "ChatCompletionRequest":
        """As vLLM checks them: tools are not empty, a tool choice needs tools, a named
        function is one of them; a tool result names its call, only assistants call."""
        for i, message in enumerate(self.messages):
            if message.role == "tool" and message.tool_call_id is None:
                raise bad_request(
                    "a 'tool' message needs 'tool_call_id'", f"messages.{i}.tool_call_id"
                )
            if message.tool_calls is not None and message.role != "assistant":
                raise bad_request(
                    "only 'assistant' messages carry 'tool_calls'", f"messages.{i}.tool_calls"
                )
        if self.tools == []:
            raise bad_request(
                "`tools` must not be an empty array. Either provide at least one tool or "
                "omit the field entirely.",
                "tools",
            )
        if self.tool_choice not in (None, "none") and self.tools is None:
            raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
        choice, names = self.tool_choice, {t.function.name for t in self.tools or ()}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise bad_request(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )
        return self

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """``tool_choice``; when absent, ``"auto"`` with tools and ``"none"`` without (OpenAI's
        and vLLM's defaults)."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
