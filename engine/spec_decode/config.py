"""vLLM's ``--speculative-config``: which proposer guesses how many tokens ahead."""

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model")
"""Proposers kvserve runs."""
VLLM_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix")
"""vLLM's other methods: named in the error that refuses them."""
DEFAULT_PROMPT_LOOKUP = 5
"""``prompt_lookup_min`` and ``prompt_lookup_max`` when neither is given (vLLM's)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method`` ``ngram`` proposes, for a request, the ``num_speculative_tokens`` tokens
    that followed the latest earlier occurrence of its last n tokens (prompt and output), n
    from ``prompt_lookup_max`` down to ``prompt_lookup_min``; one given alone sets the other,
    neither gives both 5 (vLLM's rule). ``draft_model`` decodes them greedily with ``model``,
    a smaller checkpoint of the same tokenizer (``draft_model.DraftModel``)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            known = "a vLLM method kvserve does not run" if self.method in VLLM_METHODS else None
            raise ValueError(
                f"speculative_config.method {self.method!r} is not supported"
                f"{f' ({known})' if known else ''}; supported: {', '.join(METHODS)}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"speculative_config.{name} must be an integer, got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"speculative_config.{name} must be >= 1, got {value}")
        if self.method == "draft_model":
            if self.model is None:
                raise ValueError("speculative_config.model is required for method draft_model")
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                if getattr(self, name) is not None:
                    raise ValueError(f"speculative_config.{name} is for method ngram")
            return
        if self.model is not None:
            raise ValueError(
                f"speculative_config.model is for a draft model; method {self.method!r} takes none"
            )
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        low, high = low or high, high or low
        assert low is not None and high is not None
        if low > high:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({low}) must be <= prompt_lookup_max "
                f"({high})"
            )
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    @classmethod
    def from_dict(cls, data: Any) -> "SpeculativeConfig":
        """From the flag's (or ``LLM(speculative_config=...)``'s) mapping; ``ValueError``
        names a missing, unknown or bad key."""
        if not isinstance(data, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {data!r}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"speculative_config has unsupported keys: {', '.join(unknown)}")
        for name in ("method", "num_speculative_tokens"):
            if name not in data:
                raise ValueError(f"speculative_config.{name} is required")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "SpeculativeConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not JSON: {exc}") from exc
        return cls.from_dict(data)
