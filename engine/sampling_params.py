"""Generation knobs of one request, validated once."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """Immutable per-request generation settings.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` and
    ``min_p == 0`` switch those filters off. ``max_tokens=None`` lets a request
    run to the end of the model's context. A request with a ``seed`` draws from
    its own generator, so its output does not depend on what else is batched.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        checks = {
            "n": self.n >= 1,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "min_p": 0 <= self.min_p <= 1,
            "max_tokens": self.max_tokens is None or self.max_tokens >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")
        if self.n != 1:
            raise ValueError("n > 1 is not supported by this engine yet")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
