"""The generation knobs that ``/v1/completions`` and ``/v1/chat/completions`` share."""

from typing import Any, Literal

from pydantic import Field, model_validator

from kvserve.server.errors import bad_request
from kvserve.server.protocol.base import Body

MAX_LOGPROBS = 20
# Seeds are 64-bit, as vLLM takes them; sample i of n uses seed + i, which still fits.
MAX_SEED = 2**63 - 1


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(Body):
    """``response_format.json_schema``, as OpenAI defines it (``strict`` or not, the output
    is constrained to the schema)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
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


class StructuredOutputs(Body):
    """vLLM's ``structured_outputs`` extra parameter: at most one of its constraints."""

    json_schema: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class SamplingBody(Body):
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
