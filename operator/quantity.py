"""Kubernetes resource quantities ("500m", "16Gi", "1.5", "2e3"), parsed exactly.

The API server accepts any quantity of the grammar and clamps one beyond 2^63-1 to that value,
so a typo such as ``memory: 16000000Ei`` gives pods that can never be scheduled. The operator
parses quantities itself and holds each resource within bounds a serving pod can meet.
"""

import re
from decimal import Decimal

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity in the Kubernetes grammar; ``ValueError`` otherwise."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix and abs(int(suffix[1:])) > 100:
        raise ValueError(f"{text!r}: exponent out of range")
    return number.scaleb(int(suffix[1:])) if suffix else number


def check_quantity(field: str, text: str, low: str, high: str) -> Decimal:
    """``text`` parsed, within the quantities [low, high]; else ``ValueError`` naming ``field``."""
    try:
        value = parse_quantity(text)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None
    if not parse_quantity(low) <= value <= parse_quantity(high):
        raise ValueError(f"{field} {text!r} is outside {low}..{high}")
    return value
