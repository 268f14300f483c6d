"""Ceiling division, the one spelling of "how many blocks hold this many tokens"."""


def cdiv(numerator: int, denominator: int) -> int:
    """The smallest integer ``>= numerator / denominator`` (for a positive denominator)."""
    return -(-numerator // denominator)
