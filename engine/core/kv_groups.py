"""Which layers share a block table: the KV-cache groups of a model, from each layer's kind."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvserve.engine.cdiv import cdiv

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
SHARED = "kv_shared"
"""A layer that reads another layer's keys and values (Gemma 4's KV-shared layers)."""
LAYER_KINDS = (FULL, SLIDING, LINEAR, SHARED)


@dataclass(frozen=True)
class LayerKind:
    """One layer's memory: ``kind`` is one of LAYER_KINDS; ``window`` (sliding layers only)
    the number of positions a query sees, itself included."""

    kind: str
    window: int | None = None
    token_elements: int = 1
    """Elements of one token's keys (or values) in this layer: kv heads x head size."""

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"layer kind {self.kind!r} is not one of {', '.join(LAYER_KINDS)}")
        if self.kind == SLIDING and self.window is None:
            raise ValueError("a sliding_attention layer needs a window")
        if self.kind != SLIDING and self.window is not None:
            raise ValueError(f"a {self.kind} layer has no window (got {self.window})")
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be >= 1, got {self.window}")


@dataclass(frozen=True)
class KVGroup:
    """Attention layers that share one block table per request: ``layers[i]`` keeps its keys
    and values in the ``i``-th slice of the pages at the table's block ids.

    Block id ``b`` is one page of every group's layers: the cache is a page of keys and one
    of values per block id, shared by all the groups, and one pool of block ids serves them
    all without two groups ever sharing a page. Pages are equal in bytes: a group of layers
    of a smaller shape holds more of them (``kv_groups``), so a model whose layers differ in
    kv heads or head size (Gemma 4's global layers) fills its pages as one of one shape.
    """

    kind: str
    window: int | None
    layers: tuple[int, ...]
    token_elements: int = 1
    """Elements of one token's keys in each of its layers (``LayerKind.token_elements``)."""

    def max_blocks(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """The most blocks one request of ``num_tokens`` tokens holds in this group, computing
        at most ``chunk`` of them in a step: a window's (and a chunk's) worth at most in a
        sliding-window group."""
        blocks = cdiv(num_tokens, block_size)
        if self.window is None:
            return blocks
        return min(blocks, cdiv(self.window - 1 + chunk, block_size) + 1)

    def blocks_skipped(self, first_position: int, block_size: int) -> int:
        """Leading blocks of a table that a query at ``first_position`` or later never reads
        again (every position in them is out of its window): 0 for full attention."""
        if self.window is None:
            return 0
        return max(0, (first_position - self.window + 1) // block_size)


def kv_groups(kinds: Sequence[LayerKind]) -> tuple[KVGroup, ...]:
    """The attention layers of ``kinds`` (linear ones keep a state slot, not blocks; KV-shared
    ones read another layer's) grouped by kind, window and shape into groups of equal
    bytes, full attention first.

    Of one shape, a group has as many layers as the smallest (kind, window) set, so that a
    page is never larger than that set needs; larger sets are cut into groups of that many
    layers, in layer order (a last shorter group leaves the rest of its pages unused). Of
    several shapes (vLLM's way), a page holds the least common multiple of the shapes'
    token elements as many times as the smallest set's layers fill, and each set's groups
    as many of its layers as fill a page. A model of one kind is one group of all its
    layers: the cache of a dense model, as it always was.
    """
    by_kind: dict[tuple[str, int | None, int], list[int]] = {}
    for index, layer in enumerate(kinds):
        if layer.kind not in (LINEAR, SHARED):
            by_kind.setdefault((layer.kind, layer.window, layer.token_elements), []).append(index)
    if not by_kind:
        return ()
    unit = math.lcm(*(elements for _, _, elements in by_kind))
    smallest = min(len(layers) * key[2] for key, layers in by_kind.items())
    page = unit * max(1, smallest // unit)
    order = sorted(by_kind, key=lambda key: (key[0] != FULL, key[1] or 0, key[2]))
    groups = []
    for kind, window, elements in order:
        layers, size = by_kind[(kind, window, elements)], page // elements
        for start in range(0, len(layers), size):
            groups.append(KVGroup(kind, window, tuple(layers[start : start + size]), elements))
    return tuple(groups)


def group_size(groups: Sequence[KVGroup]) -> int:
    """Layers of the largest group."""
    return max((len(group.layers) for group in groups), default=0)


def page_elements(groups: Sequence[KVGroup]) -> int:
    """Elements of one token's keys in one page: the most any group's layers hold."""
    return max((len(group.layers) * group.token_elements for group in groups), default=0)


def held_pages(groups: Sequence[KVGroup], layers: range) -> list[int]:
    """The page positions (KV tensor pairs) that ``layers`` (a pipeline stage's) use, in
    order: a stage allocates those alone, and its block is that many pages."""
    return sorted({i for g in groups for i, layer in enumerate(g.layers) if layer in layers})
