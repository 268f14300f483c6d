"""One KV group's side of the cache: how its block table grows, drops and hits the prefix cache."""

from collections.abc import Callable

from kvserve.engine.core.block_hash import BlockHash
from kvserve.engine.core.block_pool import Block, BlockPool
from kvserve.engine.core.kv_groups import KVGroup


class FullAttentionTables:
    """A full-attention group: a request's table holds a block for every block of its
    context; a prefix hit is the longest run of cached blocks from the first."""

    def __init__(self, index: int, group: KVGroup, pool: BlockPool, block_size: int) -> None:
        self.index = index
        self.group = group
        self.pool = pool
        self.block_size = block_size

    def num_skipped(self, first_position: int) -> int:
        """Leading blocks a request no longer reads once it computes from ``first_position``."""
        return 0

    def hit_length(self, hashes: Callable[[int], BlockHash], most: int) -> int:
        """Blocks of the longest cached prefix, at most ``most``; ``hashes(i)`` is the key of
        the prompt's block ``i``."""
        for i in range(most):
            if self.pool.lookup(hashes(i), self.index) is None:
                return i
        return most

    def hit_blocks(self, hashes: list[BlockHash], length: int) -> list[Block]:
        """The cached blocks of a hit of ``length`` blocks, null where none is read."""
        skipped = self.num_skipped(length * self.block_size)
        assert self.pool.null_block is not None or skipped == 0
        blocks = [self.pool.null_block] * skipped
        for key in hashes[skipped:length]:
            block = self.pool.lookup(key, self.index)
            assert block is not None  # checked by hit_length
            blocks.append(block)
        return blocks  # type: ignore[return-value]


class SlidingWindowTables(FullAttentionTables):
    """A sliding-window group: the blocks wholly before the window of a request's next query
    go back to the pool while it runs (their table entries become the null block), so a
    request holds about ``window / block_size + 1`` blocks of this group whatever its
    length. A prefix hit of ``h`` blocks needs cached only the blocks the query at position
    ``h * block_size`` reads."""

    def num_skipped(self, first_position: int) -> int:
        return self.group.blocks_skipped(first_position, self.block_size)

    def hit_length(self, hashes: Callable[[int], BlockHash], most: int) -> int:
        """The longest hit, at most ``most`` blocks, whose read blocks are all cached."""
        end = most
        while end > 0:
            for i in range(end - 1, self.num_skipped(end * self.block_size) - 1, -1):
                if self.pool.lookup(hashes(i), self.index) is None:
                    end = i  # every hit past i reads block i
                    break
            else:
                return end
        return 0
