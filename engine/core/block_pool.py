"""Fixed-size KV blocks: a free queue, reference counts and the prefix-cache index."""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvserve.engine.core.block_hash import BlockHash
from kvserve.engine.kv_events import KVEventLog


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every KV block of the cache.

    Invariants: a block is in the free queue exactly when its ``ref_count`` is
    0; a block with a ``block_hash`` is findable through ``lookup`` until it is
    handed out again. Free blocks are taken from the front of the queue (least
    recently freed first), so an unreferenced cached block is evicted only when
    no block that is older in the queue is left: LRU over cached blocks.

    With an ``events`` log, every change of the index is recorded there as it happens: a
    block cached (``BlockStored``), a cached block evicted (``BlockRemoved``), the index
    dropped (``AllBlocksCleared``). Replaying the log gives exactly the hashes ``lookup``
    finds.
    """

    def __init__(
        self, num_blocks: int, enable_caching: bool, events: KVEventLog | None = None
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, Block] = {}
        self.events = events

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def free_block_ids(self) -> list[int]:
        """The free queue's block ids, the next one handed out first."""
        return list(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some request (cached-but-free counts as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, count: int) -> list[Block]:
        """Hand out ``count`` free blocks with ref_count 1, evicting their cache entries."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                if self.events is not None:
                    self.events.removed(block.block_hash)
                block.block_hash = None
            block.ref_count = 1
            blocks.append(block)
        return blocks

    def lookup(self, block_hash: BlockHash) -> Block | None:
        return self._cached.get(block_hash)

    def touch(self, blocks: list[Block]) -> None:
        """Take one more reference on each block (prefix-cache hits)."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: list[Block]) -> None:
        """Drop one reference on each block, in the order given; unreferenced blocks
        join the back of the free queue (callers pass a table tail-first so a
        request's last blocks are evicted before its shared prefix)."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            if block.ref_count == 0:
                self._free[block.block_id] = block

    def cache(
        self,
        block: Block,
        block_hash: BlockHash,
        parent_hash: BlockHash | None,
        token_ids: Sequence[int],
        lora_name: str | None = None,
    ) -> None:
        """Make a full block (``token_ids``, after the block keyed ``parent_hash``, of LoRA
        adapter ``lora_name`` if any) findable by its hash (first writer wins on a
        duplicate)."""
        if self.enable_caching and block.block_hash is None and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block
            if self.events is not None:
                self.events.stored(block_hash, parent_hash, list(token_ids), lora_name)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no block is in use (else False and no change)."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        if self.events is not None:
            self.events.cleared()
        return True
