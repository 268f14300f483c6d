"""Generation knobs of one request, validated once."""

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """Immutable per-request generation settings.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` and
    ``min_p == 0`` switch those filters off. ``max_tokens=None`` lets a request
    run to the end of the model's context. A request with a ``seed`` draws from
    its own generator, so its output does not depend on what else is batched.

    Penalties follow OpenAI (``presence``/``frequency``: subtracted per generated
    occurrence, in [-2, 2]) and vLLM (``repetition``: logits of tokens seen in the
    prompt or output divided by it when positive, multiplied when negative).
    ``stop`` strings end the request with the text before them. Before ``min_tokens``
    outputs, EOS and ``stop_token_ids`` cannot be sampled and stop strings do not
    count. ``logprobs``/``prompt_logprobs`` ask for that many top alternatives per
    position (0: only the chosen token's), taken from the raw logits (before bias,
    penalties and temperature), as vLLM does by default.
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        checks = {
            "n": self.n >= 1,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "min_p": 0 <= self.min_p <= 1,
            "max_tokens": self.max_tokens is None or self.max_tokens >= 1,
            "presence_penalty": -2 <= self.presence_penalty <= 2,
            "frequency_penalty": -2 <= self.frequency_penalty <= 2,
            "repetition_penalty": self.repetition_penalty > 0,
            "stop": all(isinstance(s, str) and s for s in self.stop),
            "min_tokens": 0 <= self.min_tokens <= (self.max_tokens or self.min_tokens),
            "logit_bias": all(math.isfinite(v) for v in self.logit_bias.values()),
            "logprobs": self.logprobs is None or self.logprobs >= 0,
            "prompt_logprobs": self.prompt_logprobs is None or self.prompt_logprobs >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")
        if self.n != 1:
            raise ValueError("n > 1 is not supported by this engine yet")

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
