"""The request bodies' base model and how a body is parsed: strict types, unknown and
unsupported fields refused, every failure a 400 naming the first bad field by its path.

Every field OpenAI defines is either honoured or rejected with a 400 that names it
(``UNSUPPORTED``); unknown fields are rejected too, so nothing is silently ignored. The bodies
are split by endpoint: ``sampling`` (what completions and chat share), ``completions``,
``chat``, ``tokenize``.
"""

import re
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kvserve.server.errors import APIError, bad_request

# How pydantic names the member of a union in an error's location ("str", "list[int]",
# "list[TextPart]"): not part of the parameter's name.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|(list|dict|tuple)\[.+\])")
BodyT = TypeVar("BodyT", bound=BaseModel)


class Body(BaseModel):
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
