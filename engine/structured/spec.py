"""What a request's whole output must match, as the client asked for it (before compiling)."""

from dataclasses import dataclass
from typing import Literal

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class OutputConstraint:
    """One constraint on a request's output.

    ``json``: ``value`` is a JSON schema as JSON text; ``json_object``: any JSON object
    (``value`` empty); ``regex``: the whole output matches the regular expression ``value``;
    ``choice``: the output is exactly one of ``choices``; ``grammar``: ``value`` is an EBNF
    grammar. Equal constraints compile to the same grammar, so they are the cache key.
    """

    kind: ConstraintKind
    value: str = ""
    choices: tuple[str, ...] = ()
