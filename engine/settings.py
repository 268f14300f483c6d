"""One declaration per setting: a config dataclass's field and how it is spelled outside the code.

A field made with ``setting(...)`` is a ``kvserve serve`` flag (``--`` + its name with dashes),
an environment variable (``KVSERVE_`` + its name in capitals) and, where it has a ``Crd``, a
field of the LLMDeployment CRD's ``engine`` block (its name in camelCase) that the operator
renders as that flag. ``server/cli.py`` builds its parser from ``declared(...)``;
``operator/spec.py`` builds ``EngineSpec`` from it; a test holds the CRD's YAML to it.
This module imports no torch: the operator reads it.
"""

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from types import NoneType, UnionType
from typing import Any

ENV_PREFIX = "KVSERVE_"


@dataclass(frozen=True)
class Crd:
    """The setting's field in the CRD's ``engine`` block.

    ``defaulted``: the CRD gives the config's default, and the operator always renders the
    flag; otherwise the field is optional and rendered only when set. ``schema``: what the CRD
    states beyond the type, the choices, the minimum and the default (bounds, a narrower
    enum). ``with_flags``: flags rendered just before this one's when it is set."""

    defaulted: bool = False
    schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    with_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    """``minimum`` is checked by the config and stated by the CRD; ``parse`` turns a flag's
    text into the value (default: the field's type)."""

    help: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    crd: Crd | None = None
    nargs: str | None = None
    """argparse's: ``"+"`` takes one or more values (a list; from the environment variable,
    a JSON array or its whitespace-separated words, a JSON object one word: ``cli.env_words``)."""


def setting(default: Any = MISSING, **spelling: Any) -> Any:
    """A dataclass field with its ``Setting`` (keywords as ``Setting``'s)."""
    return dataclasses.field(default=default, metadata={"setting": Setting(**spelling)})


@dataclass(frozen=True)
class Declared:
    """One declared field, resolved: ``kind`` is its type without ``None``."""

    name: str
    kind: type
    default: Any
    """The field's default; None for a field without one."""
    setting: Setting

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def crd_name(self) -> str:
        first, *rest = self.name.split("_")
        return first + "".join(word.capitalize() for word in rest)


def declared(cls: type) -> list["Declared"]:
    """The fields of dataclass ``cls`` made with ``setting``, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "setting" not in f.metadata:
            continue
        hint = hints[f.name]
        if isinstance(hint, UnionType):
            (hint,) = [a for a in typing.get_args(hint) if a is not NoneType]
        default = None if f.default is MISSING else f.default
        out.append(Declared(f.name, hint, default, f.metadata["setting"]))
    return out


def check_minimums(config: Any) -> None:
    """``ValueError`` naming the first declared field of ``config`` below its minimum."""
    for d in declared(type(config)):
        value = getattr(config, d.name)
        if d.setting.minimum is not None and value is not None and value < d.setting.minimum:
            raise ValueError(f"{d.name} must be >= {d.setting.minimum}, got {value}")
