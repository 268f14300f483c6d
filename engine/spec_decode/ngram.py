"""Prompt lookup: guess that a request goes on as it went on after its last n tokens before."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from kvserve.engine.core.request import Request
from kvserve.engine.spec_decode.config import SpeculativeConfig


class NgramProposer:
    """For tokens ``t``: the longest n (``prompt_lookup_max`` down to ``prompt_lookup_min``)
    whose last n tokens occurred earlier in ``t``; the tokens that followed their latest
    earlier occurrence, at most ``num_speculative_tokens`` (and ``limit``) of them. Nothing
    when no suffix recurs."""

    def __init__(self, config: SpeculativeConfig) -> None:
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        return [
            self.lookup(r.all_token_ids, limit) for r, limit in zip(requests, limits, strict=True)
        ]

    def lookup(self, token_ids: list[int], limit: int) -> list[int]:
        k = min(self.k, limit)
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            # windows that start before the suffix itself and leave a token after them
            windows = sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start : start + k].tolist()
        return []
