"""A request body's output constraint: which parameter asked for it, and a 400 if it is
unusable, found by compiling it before anything is queued."""

import asyncio
import json
from typing import Any

from kvserve.engine.structured.compiler import GrammarCompiler, InvalidConstraintError
from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.errors import bad_request
from kvserve.server.protocol.sampling import SamplingBody


def _json_schema(value: str | dict[str, Any], param: str) -> OutputConstraint:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise bad_request(f"{param}: the JSON schema is not valid JSON", param) from None
    if not isinstance(value, dict):
        raise bad_request(f"{param}: a JSON schema must be an object", param)
    return OutputConstraint("json", json.dumps(value))


def _vllm_style(
    prefix: str,
    schema: str | dict[str, Any] | None,
    regex: str | None,
    choice: list[str] | None,
    grammar: str | None,
    json_object: bool | None,
) -> list[tuple[str, OutputConstraint]]:
    """The constraints of vLLM's ``structured_outputs.*`` or ``guided_*`` parameters."""
    found = []
    if schema is not None:
        found.append((prefix + "json", _json_schema(schema, prefix + "json")))
    if regex is not None:
        found.append((prefix + "regex", OutputConstraint("regex", regex)))
    if choice is not None:
        found.append((prefix + "choice", OutputConstraint("choice", choices=tuple(choice))))
    if grammar is not None:
        found.append((prefix + "grammar", OutputConstraint("grammar", grammar)))
    if json_object:
        found.append((prefix + "json_object", OutputConstraint("json_object")))
    return found


def _asked(body: SamplingBody) -> list[tuple[str, OutputConstraint]]:
    """Every constraint the body gives, with the parameter that gives it."""
    asked = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        asked.append(("response_format", OutputConstraint("json_object")))
    if fmt is not None and fmt.json_schema is not None:
        param = "response_format.json_schema.schema"
        asked.append((param, _json_schema(fmt.json_schema.json_schema, param)))
    so = body.structured_outputs
    if so is not None:
        asked += _vllm_style(
            "structured_outputs.", so.json_schema, so.regex, so.choice, so.grammar, so.json_object
        )
    asked += _vllm_style(
        "guided_",
        body.guided_json,
        body.guided_regex,
        body.guided_choice,
        body.guided_grammar,
        None,
    )
    return asked


def requested_constraint(body: SamplingBody) -> tuple[str, OutputConstraint] | None:
    """The body's one output constraint and its parameter; 400 if it gives more than one."""
    asked = _asked(body)
    if len(asked) > 1:
        names = ", ".join(f"'{param}'" for param, _ in asked)
        raise bad_request(
            f"only one kind of structured output can be asked for; got {names}", asked[1][0]
        )
    return asked[0] if asked else None


async def checked_constraint(
    grammars: GrammarCompiler, body: SamplingBody
) -> OutputConstraint | None:
    """The body's output constraint, compiled once on the engine's grammar pool (the engine
    finds it in the cache); 400 naming the parameter if it does not compile."""
    requested = requested_constraint(body)
    if requested is None:
        return None
    param, constraint = requested
    await check_compiles(grammars, constraint, param)
    return constraint


async def check_compiles(grammars: GrammarCompiler, constraint: OutputConstraint, param: str):
    """400 naming ``param`` if ``constraint`` does not compile (waits on the pool, not
    here). Shielded: a client that goes away must not cancel the cached compile."""
    try:
        await asyncio.shield(asyncio.wrap_future(grammars.submit(constraint)))
    except InvalidConstraintError as exc:
        raise bad_request(f"{param}: {exc}", param) from None
