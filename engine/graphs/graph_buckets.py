"""The shapes a CUDA graph is captured at: a step is padded up to the smallest that holds it.

A graph replays fixed launches: the token count (every matmul's rows), the sequence count
and the largest query (the Triton attention's grid, ``attention_launch``) are frozen in it.
A decode step (one token a sequence) is ``Bucket(n, n, 1)``: the decode launch, its keys
split. A mixed step (decodes with small prefill chunks) is padded in all three: its extra
token rows write slot -1 and belong to no sequence, its extra sequences have no query token
and their attention programs return at once, and a larger largest query only adds programs
that return at once (``test_a_mixed_batch_padded_to_a_larger_launch_gives_the_same_rows``).

What padding costs: token rows go through every matmul (≈ free while a step's matmuls are
bound by reading the weights, up to a few hundred rows on an H100), while each padded
sequence and query tile adds ``num_kv_heads`` attention programs per layer that only read
two integers. So the token sizes are powers of two, and the sequence and query sizes
powers of four: ``mixed_buckets(512, 256)`` is 46 shapes (64 tokens: 3 x 2, 128: 4 x 3,
256: 4 x 3, 512: 4 x 4), next to the 35 decode sizes of ``capture_sizes(256)``.
"""

import bisect
from dataclasses import dataclass

SMALLEST_MIXED_TOKENS = 64
"""Fewer tokens pad to this many: below it a step's matmuls cost the same at any size."""


@dataclass(frozen=True, order=True)
class Bucket:
    """A captured step's shape: token rows, sequences (the attention grid's first axis;
    also the rows of hidden states it returns), and the largest query the launch is
    sized for (1: a decode launch)."""

    tokens: int
    seqs: int
    max_query_len: int


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Decode batch sizes: 1, 2, 4, then every multiple of 8 below ``max_num_seqs``, then
    ``max_num_seqs``."""
    small = [size for size in (1, 2, 4) if size < max_num_seqs]
    return [*small, *range(8, max_num_seqs, 8), max_num_seqs]


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``num_seqs``; None if none does."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


def _powers(base: int, start: int, top: int) -> list[int]:
    """``start``, ``start * base``, ... below ``top``, then ``top`` (ascending)."""
    sizes = []
    size = start
    while size < top:
        sizes.append(size)
        size *= base
    return [*sizes, top]


class MixedBuckets:
    """The mixed steps' shapes for steps of up to ``max_tokens`` tokens and ``max_num_seqs``
    sequences: per token size ``T`` (powers of two from ``SMALLEST_MIXED_TOKENS``, then
    ``max_tokens``), sequence sizes 4, 16, 64 ... up to ``min(T, max_num_seqs)`` and query
    sizes 16, 64, 256 ... up to ``T``."""

    def __init__(self, max_tokens: int, max_num_seqs: int) -> None:
        if max_tokens < 2:
            raise ValueError(f"a mixed step has 2 tokens or more, got max_tokens {max_tokens}")
        self.max_tokens = max_tokens
        self.max_num_seqs = max_num_seqs
        self.token_sizes = _powers(2, min(SMALLEST_MIXED_TOKENS, max_tokens), max_tokens)
        self.seq_sizes = {t: _powers(4, 4, min(t, max_num_seqs)) for t in self.token_sizes}
        self.query_sizes = {t: _powers(4, 16, t) for t in self.token_sizes}

    def all(self) -> list[Bucket]:
        return [
            Bucket(t, s, q)
            for t in self.token_sizes
            for s in self.seq_sizes[t]
            for q in self.query_sizes[t]
        ]

    def choose(self, num_tokens: int, num_seqs: int, max_query_len: int) -> Bucket | None:
        """The smallest shape that holds a step of ``num_tokens`` tokens, ``num_seqs``
        sequences (or hidden-state rows out, if more) and a largest query of
        ``max_query_len``; None if none does."""
        tokens = padded_size(num_tokens, self.token_sizes)
        if tokens is None:
            return None
        seqs = padded_size(num_seqs, self.seq_sizes[tokens])
        query = padded_size(max_query_len, self.query_sizes[tokens])
        if seqs is None or query is None:
            return None
        return Bucket(tokens, seqs, query)
