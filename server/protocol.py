"""Request bodies of the OpenAI-compatible API, validated with pydantic.

Every field OpenAI defines is either honoured or rejected with a 400 that names it
(``UNSUPPORTED``); unknown fields are rejected too, so nothing is silently ignored.
"""

import re
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


class SamplingBody(_Body):
    """The generation knobs shared by completions and chat."""

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


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingBody):
    UNSUPPORTED = (
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "parallel_tool_calls",
        "response_format",
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

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
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
