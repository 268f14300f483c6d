"""Prefix-cache keys: a collision-resistant content hash of a full block, chained on its parent's.

A block's key is SHA-256 over a fixed layout, the same in every process and on every machine::

    parent key (32 bytes; 32 zero bytes for a request's first block)
    number of token ids (4 bytes, little-endian, unsigned)
    token ids (8 bytes each, little-endian, signed)

so two blocks share a key only if they hold the same tokens after the same prefix (up to a
SHA-256 collision). Python's ``hash`` of the same tuple, used before, was 64 bits with
collisions anyone can build (``hash(-1) == hash(-2)``, ``hash(x) == hash(x + 2**61 - 1)``) and
differed from process to process (``hash(None)`` is an address), so two pods' KV events for
the same prefix did not agree (vLLM's CVE-2025-25183 is the same hole). Measured cost:
benchmarks/step_split.py --prefix-caching, in benchmarks/results/prefix-hash-cost.md.
"""

import hashlib
import struct
from collections.abc import Callable, Sequence

BlockHash = bytes
ROOT_PARENT = bytes(32)
"""The parent key of a request's first block."""


def sha256_chain(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The key of a full block of ``token_ids`` that follows the block keyed ``parent``."""
    count = len(token_ids)
    data = (parent or ROOT_PARENT) + struct.pack(f"<I{count}q", count, *token_ids)
    return hashlib.sha256(data).digest()


HASH_ALGOS: dict[str, Callable[[BlockHash | None, Sequence[int]], BlockHash]] = {
    "sha256": sha256_chain,
}
"""vLLM's ``--prefix-caching-hash-algo`` names the ones it has; kvserve has the default."""
