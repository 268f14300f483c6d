"""Which layers share a block table: the KV-cache groups of a model, from each layer's kind."""

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
    and values in the ``i``-th KV tensor pair of the cache, at the table's block ids.

    Every group has at most ``group_size`` layers (``kv_groups``), so one block id is one
    page of ``group_size`` layers: the cache is ``group_size`` tensor pairs shared by all the
    groups, and one pool of block ids serves them all without two groups ever sharing a
    page. So every attention layer's KV tensors have one shape (kv heads, head size): a
    model whose layers differ in it is refused as its config is read (Gemma 4's
    ``global_head_dim``: ``gemma_config.refuse_gemma4_features``). Serving one would make
    the pages equal in bytes instead (more layers of the smaller shape per group).
    """

    kind: str
    window: int | None
    layers: tuple[int, ...]

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
    ones read another layer's) grouped
    by kind and window into groups of equal size, full attention first.

    The size is the layer count of the smallest (kind, window) set, so that a page is never
    larger than that set needs; larger sets are cut into groups of that many layers, in layer
    order (a last shorter group leaves the rest of its pages unused). A model of one kind is
    one group of all its layers: the cache of a dense model, as it always was.
    """
    by_kind: dict[tuple[str, int | None], list[int]] = {}
    for index, layer in enumerate(kinds):
        if layer.kind not in (LINEAR, SHARED):
            by_kind.setdefault((layer.kind, layer.window), []).append(index)
    if not by_kind:
        return ()
    size = min(len(layers) for layers in by_kind.values())
    order = sorted(by_kind, key=lambda key: (key[0] != FULL, key[1] or 0))
    return tuple(
        KVGroup(kind, window, tuple(by_kind[(kind, window)][start : start + size]))
        for kind, window in order
        for start in range(0, len(by_kind[(kind, window)]), size)
    )


def group_size(groups: Sequence[KVGroup]) -> int:
    """KV tensor pairs the cache needs: layers per page."""
    return max((len(group.layers) for group in groups), default=0)
