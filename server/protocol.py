"""Request bodies of the OpenAI-compatible API, validated with pydantic.

Every field OpenAI defines is either honoured or rejected with a 400 that names it
(``UNSUPPORTED``); unknown fields are rejected too, so nothing is silently ignored.
"""

import re
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvserve.server.errors import APIError, bad_request

MAX_LOGPROBS = 20
# Seeds are 64-bit, as vLLM takes them; sample i of n uses seed + i, which still fits.
MAX_SEED = 2**63 - 1
# How pydantic names the member of a union in an error's location ("str", "list[int]",
# "list[TextPart]"): not part of the parameter's name.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|(list|dict|tuple)\[.+\])")
BodyT = TypeVar("BodyT", bound=BaseModel)


class _Body(BaseModel):
    # Strict types, as OpenAI checks them: true, 5.0 and "5" are not integers (nor token
    # ids), 1 and "true" are not booleans; an integer is a number.
    model_config = ConfigDict(extra="forbid", strict=True)

    # Fields that OpenAI defines but this server does not implement: rejected when set.
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in cls.UNSUPPORTED:
                if data.get(name) is not None:
                    raise bad_request(f"'{name}' is not supported by this server", param=name)
        return data


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    """``response_format.json_schema``, as OpenAI defines it (``strict`` or not, the output
    is constrained to the schema)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise bad_request(
                "'response_format.json_schema' is required with type 'json_schema' and only "
                "allowed with it",
                "response_format.json_schema",
            )
        return self


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` extra parameter: at most one of its constraints."""

    json_schema: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class SamplingBody(_Body):
    """The generation knobs shared by completions and chat; ``response_format``,
    ``structured_outputs`` and the older ``guided_*`` parameters constrain the output
    (see ``server/structured.py``)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = Field(None, ge=-MAX_SEED - 1, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _check_shared(self) -> "SamplingBody":
        if self.stream_options is not None and not self.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream")
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 9):
                raise bad_request(f"logit_bias key {key!r} is not a token id", "logit_bias")
            if not -100.0 <= value <= 100.0:
                raise bad_request("logit_bias values must be within [-100, 100]", "logit_bias")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingBody):
    UNSUPPORTED = ("best_of", "suffix")

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _check_prompt(self) -> "CompletionRequest":
        if self.prompt == [] or self.prompt == "" or any(p in ("", []) for p in self.prompts):
            raise bad_request("'prompt' must not be empty", "prompt")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Body):
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


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed(cls, data: Any) -> Any:
        return _without(data, {"parsed_arguments": _anything})  # the SDK's parse of arguments


class ToolCallParam(_Body):
    """A call an earlier assistant turn made, as the client sends it back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed(cls, data: Any) -> Any:
        return _without(data, {"index": lambda v: isinstance(v, int)})  # a streamed call's


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments object
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


class ChatMessage(_Body):
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


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None  # rendered with the messages, as in a chat request
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
        if self.tools is not None and self.messages is None:
            raise bad_request("'tools' are rendered with 'messages' only", "tools")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def parse_body(model: type[BodyT], data: Any) -> BodyT:
    """Validate ``data`` as ``model``; every failure becomes a 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except APIError:
        raise
    except ValidationError as exc:
        raise _validation_error(exc.errors()) from None


def _validation_error(errors: list) -> APIError:
    """A 400 for pydantic's errors, naming the first bad field by its path (``messages.0.
    content``), never by a union member's type; a value that fits no member of a union is
    said to be none of them."""
    first = errors[0]
    path = _path(first["loc"])
    if first["type"] == "extra_forbidden":
        return bad_request(f"unknown parameter '{path}'", path)
    depth = next((i for i, part in enumerate(first["loc"]) if _is_member(part)), None)
    if depth is None:
        return bad_request(f"{path}: {first['msg']}", path)
    members = [e["loc"] for e in errors if e["loc"][:depth] == first["loc"][:depth]]
    param = _path(first["loc"][:depth])
    kinds = dict.fromkeys(str(loc[depth]) for loc in members if len(loc) > depth)
    return bad_request(f"{param}: expected {' or '.join(kinds)}", param)


def _is_member(part: str | int) -> bool:
    return isinstance(part, str) and _UNION_MEMBER.fullmatch(part) is not None


def _path(loc: tuple) -> str | None:
    return ".".join(str(part) for part in loc if not _is_member(part)) or None
