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
    group: int = 0  # the KV group whose index finds it by ``block_hash``


class BlockPool:
    """Owns every KV block of the cache.

    Invariants: a block is in the free queue exactly when its ``ref_count`` is
    0; a block with a ``block_hash`` is findable through ``lookup`` until it is
    handed out again. Each KV group has an index of its own (a block holds one group's
    layers; a prompt has the same hashes in every group). Free blocks are taken from the
    front of the queue (least recently freed first), so an unreferenced cached block is
    evicted only when no block that is older in the queue is left: LRU over cached blocks.

    With ``null_block``, block 0 is never handed out: a table puts its id where a block was
    dropped (out of a sliding window); nothing reads it.

    With an ``events`` log, every change of group 0's index (full attention, when the model
    has any) is recorded there as it happens: a
    block cached (``BlockStored``), a cached block evicted (``BlockRemoved``), the index
    dropped (``AllBlocksCleared``). Replaying the log gives exactly the hashes ``lookup``
    finds.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        events: KVEventLog | None = None,
        num_groups: int = 1,
        null_block: bool = False,
    ) -> None:
        if num_blocks < 1 + null_block:
            raise ValueError(f"num_blocks must be >= {1 + null_block}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0] if null_block else None
        usable = self.blocks[1:] if null_block else self.blocks
        self.num_usable_blocks = len(usable)
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in usable)
        self._cached: list[dict[BlockHash, Block]] = [{} for _ in range(num_groups)]
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
        return 1.0 - len(self._free) / self.num_usable_blocks

    def allocate(self, count: int) -> list[Block]:
        """Hand out ``count`` free blocks with ref_count 1, evicting their cache entries."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                del self._cached[block.group][block.block_hash]
                if self.events is not None and block.group == 0:
                    self.events.removed(block.block_hash)
                block.block_hash = None
            block.ref_count = 1
            blocks.append(block)
        return blocks

    def lookup(self, block_hash: BlockHash, group: int = 0) -> Block | None:
        return self._cached[group].get(block_hash)

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
        group: int = 0,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        """Make a full block of ``group`` (``token_ids``, after the block keyed
        ``parent_hash``, of LoRA adapter ``lora_name`` numbered ``lora_id`` if any) findable
        by its hash (first writer wins on a duplicate)."""
        index = self._cached[group]
        if self.enable_caching and block.block_hash is None and block_hash not in index:
            block.block_hash, block.group = block_hash, group
            index[block_hash] = block
            if self.events is not None and group == 0:
                self.events.stored(block_hash, parent_hash, list(token_ids), lora_id, lora_name)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no block is in use (else False and no change)."""
        if len(self._free) != self.num_usable_blocks:
            return False
        for index in self._cached:
            for block in index.values():
                block.block_hash = None
            index.clear()
        if self.events is not None:
            self.events.cleared()
        return True
