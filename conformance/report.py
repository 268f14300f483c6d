"""One line per check, and the exit status: 0 only when every required check passes."""

from dataclasses import dataclass
from enum import StrEnum


class Level(StrEnum):
    REQUIRED = "required"
    """A MUST of the model-server protocol: a failure makes the run fail."""
    RECOMMENDED = "recommended"
    """Optional in the protocol (the picker falls back to its own config): reported only."""


@dataclass(frozen=True)
class Result:
    name: str
    level: Level
    passed: bool
    reason: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.name} [{self.level}]: {self.reason}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def summary(results: list[Result]) -> str:
    def count(level: Level) -> str:
        mine = [r for r in results if r.level is level]
        return f"{sum(r.passed for r in mine)}/{len(mine)} {level}"

    return f"conformance: {count(Level.REQUIRED)}, {count(Level.RECOMMENDED)} checks pass"


def exit_status(results: list[Result]) -> int:
    return 0 if all(r.passed for r in results if r.level is Level.REQUIRED) else 1
