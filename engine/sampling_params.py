"""Generation knobs of one request, validated once."""

import dataclasses
import hashlib
from dataclasses import dataclass, field

from kvserve.engine.structured.spec import OutputConstraint

# Bounds that keep every value representable where the sampler puts it: top-k ranks in
# int32 (larger means the whole vocabulary), seeds in what a 64-bit generator accepts
# (negative ones as two's complement), floats finite in float32.
MAX_TOP_K = 2**31 - 1
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
MAX_FLOAT = 3.4028234663852886e38
# Temperatures below this are greedy, as in vLLM: dividing logits by them overflows.
GREEDY_TEMPERATURE = 1e-5


def request_seed(engine_seed: int, index: int) -> int:
    """The seed of the ``index``-th request an engine started with ``engine_seed`` takes when
    the request gives none: a hash of both, so neighbouring requests (and engines) draw
    unrelated streams, in [0, 2**63)."""
    digest = hashlib.blake2b(f"{engine_seed},{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class SamplingParams:
    """Immutable per-request generation settings.

    ``temperature == 0`` (or below ``GREEDY_TEMPERATURE``) means greedy. ``top_k <= 0``
    (or at least the vocabulary size) and ``top_p == 1`` and
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
    penalties and temperature), as vLLM does by default. ``n`` samples are drawn for the
    prompt (``parent_request``: with a seed, sample ``i`` uses ``seed + i``).
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
    constraint: OutputConstraint | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        checks = {
            "n": (self.n >= 1, ">= 1"),
            "temperature": (0 <= self.temperature <= MAX_FLOAT, "finite and >= 0"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "top_k": (-1 <= self.top_k <= MAX_TOP_K, f"in [-1, {MAX_TOP_K}]"),
            "min_p": (0 <= self.min_p <= 1, "in [0, 1]"),
            "seed": (self.seed is None or MIN_SEED <= self.seed <= MAX_SEED, "a 64-bit integer"),
            "max_tokens": (self.max_tokens is None or self.max_tokens >= 1, ">= 1"),
            "presence_penalty": (-2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            "frequency_penalty": (-2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            "repetition_penalty": (0 < self.repetition_penalty <= MAX_FLOAT, "finite and > 0"),
            "stop": (all(isinstance(s, str) and s for s in self.stop), "non-empty strings"),
            "min_tokens": (
                0 <= self.min_tokens <= (self.max_tokens or self.min_tokens),
                "in [0, max_tokens]",
            ),
            "logit_bias": (
                all(-MAX_FLOAT <= v <= MAX_FLOAT for v in self.logit_bias.values()),
                "finite values",
            ),
            "logprobs": (self.logprobs is None or self.logprobs >= 0, ">= 0"),
            "prompt_logprobs": (self.prompt_logprobs is None or self.prompt_logprobs >= 0, ">= 0"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r} (must be {rule})")

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE
