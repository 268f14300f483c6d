"""Block tables of requests over the block pool, one per KV group, with prefix caching."""

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kvserve.engine.cdiv import cdiv
from kvserve.engine.core.block_hash import HASH_ALGOS, BlockHash
from kvserve.engine.core.block_pool import Block, BlockPool
from kvserve.engine.core.group_tables import FullAttentionTables, SlidingWindowTables
from kvserve.engine.core.kv_groups import FULL, KVGroup
from kvserve.engine.core.request import Request
from kvserve.engine.core.state_slots import StateSlots
from kvserve.engine.kv_events import KVEventLog

log = logging.getLogger(__name__)
DENSE = (KVGroup(FULL, None, ()),)
"""One full-attention group: every dense model's cache."""


@dataclass(frozen=True)
class PrefixHit:
    """The cached prefix a new request starts from: ``num_blocks`` full blocks, with their
    keys, and each group's blocks for them (the null block where a group reads none)."""

    num_blocks: int
    hashes: list[BlockHash]
    blocks: list[list[Block]]


class KVCacheManager:
    """Gives each request the blocks its tokens need, in every KV group, and its state slot.

    A request's tables (``request.block_tables``, one per group of ``groups``; one group of
    full attention for a dense model) cover its first ``num_computed_tokens`` (+ the tokens
    scheduled this step) tokens, from one pool of block ids. A sliding-window group's
    blocks go back to the pool once they leave the window of the request's next query.
    With ``num_state_slots``, the model has linear-attention layers too: a request holds one
    state slot from its admission to its end or preemption.

    With prefix caching on, full blocks are indexed by their chained content hash
    (``block_hash``; the algorithm named by ``hash_algo``), in each group, once their KV has
    been computed, and a new request starts from the longest cached run of its prompt's full
    blocks that every group holds (never the whole prompt: its last token is always
    computed, to produce the logits of the first output token). A model with state slots
    caches no prefix: its state after a prefix is not kept (it is one log line at start).
    A request under a LoRA adapter chains its first block on the adapter's key
    (``Request.prefix_root``), so two adapters, or an adapter and the base model, never
    share a block.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        events: KVEventLog | None = None,
        hash_algo: str = "sha256",
        groups: Sequence[KVGroup] = DENSE,
        num_state_slots: int = 0,
        max_step_tokens: int | None = None,
    ) -> None:
        """``max_step_tokens``: the most tokens a request computes in one step (None: its
        whole prompt), which bounds the blocks a sliding-window group needs at once."""
        if not groups:
            raise ValueError("a KV cache needs at least one group of attention layers")
        self.block_size = block_size
        self.chain_hash = HASH_ALGOS[hash_algo]
        if enable_prefix_caching and num_state_slots:
            log.info(
                "prefix caching is off: this model's linear-attention layers keep a recurrent "
                "state per request, and the state after a cached prefix is not stored"
            )
            enable_prefix_caching = False
        self.enable_prefix_caching = enable_prefix_caching
        self.groups = tuple(groups)
        sliding = any(g.window is not None for g in self.groups)
        self.pool = BlockPool(num_blocks, enable_prefix_caching, events, len(groups), sliding)
        self.tables = [
            (SlidingWindowTables if g.window is not None else FullAttentionTables)(
                i, g, self.pool, block_size
            )
            for i, g in enumerate(self.groups)
        ]
        self.sliding = [t for t in self.tables if t.group.window is not None]
        self.slots = StateSlots(num_state_slots) if num_state_slots else None
        self.max_step_tokens = max_step_tokens

    def blocks_needed(self, num_tokens: int) -> int:
        """The most blocks a request of ``num_tokens`` tokens holds at once."""
        chunk = min(self.max_step_tokens or num_tokens, num_tokens)
        return sum(g.max_blocks(num_tokens, self.block_size, chunk) for g in self.groups)

    def computed_blocks(self, request: Request) -> PrefixHit:
        """The cached prefix of a request that has none computed yet (none for a request
        that wants prompt logprobs: those need every position computed)."""
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return PrefixHit(0, [], [[] for _ in self.tables])
        hashes: list[BlockHash] = []
        tokens = request.all_token_ids
        size = self.block_size

        def key(index: int) -> BlockHash:
            while len(hashes) <= index:
                start = len(hashes) * size
                parent = hashes[-1] if hashes else request.prefix_root
                hashes.append(self.chain_hash(parent, tokens[start : start + size]))
            return hashes[index]

        length = (request.num_tokens - 1) // size
        for tables in self.tables:
            if tables.group.window is None:
                length = tables.hit_length(key, length)
        while True:
            settled = length
            for tables in self.sliding:
                length = tables.hit_length(key, length)
            if length == settled:
                break
        hashes = hashes[:length]
        return PrefixHit(length, hashes, [t.hit_blocks(hashes, length) for t in self.tables])

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit: PrefixHit | None = None
    ) -> bool:
        """Extend the request's tables (after adopting a new request's prefix ``hit``) to
        cover ``num_new_tokens`` more tokens, and give a new request its state slot. All or
        nothing: False, and no block or slot taken, when the free ones do not suffice
        (sliding-window blocks the request no longer reads are released either way)."""
        start = request.num_computed_tokens + (hit.num_blocks * self.block_size if hit else 0)
        if request.block_tables:
            for tables in self.sliding:
                self._drop_skipped(request, tables, start)
        wanted = cdiv(start + num_new_tokens, self.block_size)
        held = len(request.block_ids) + (hit.num_blocks if hit else 0)
        new_count = max(0, wanted - held) * len(self.tables)
        hit_blocks = (
            [b for group in hit.blocks for b in group if b is not self.pool.null_block]
            if hit
            else []
        )
        reclaimed = sum(1 for b in hit_blocks if b.ref_count == 0)
        if new_count > self.pool.num_free_blocks - reclaimed:
            return False
        if self.slots is not None and request.state_slot is None:
            if self.slots.num_free == 0:
                return False
            request.state_slot = self.slots.allocate()
        if not request.block_tables:
            request.block_tables = [[] for _ in self.tables]
            request.num_skipped_blocks = [0] * len(self.tables)
        if hit is not None and hit.num_blocks:
            self.pool.touch(hit_blocks)
            for i, (table, blocks) in enumerate(zip(request.block_tables, hit.blocks, strict=True)):
                table.extend(b.block_id for b in blocks)
                request.num_skipped_blocks[i] = sum(1 for b in blocks if b is self.pool.null_block)
            request.block_hashes.extend(hit.hashes)
        if new_count:
            per_group = new_count // len(self.tables)
            for table in request.block_tables:
                table.extend(b.block_id for b in self.pool.allocate(per_group))
        return True

    def _drop_skipped(
        self, request: Request, tables: FullAttentionTables, first_position: int
    ) -> None:
        """Release the blocks of ``tables``'s group wholly before the window of a query at
        ``first_position``, tail first; the null block takes their places in the table."""
        done = request.num_skipped_blocks[tables.index]
        skipped = min(tables.num_skipped(first_position), len(request.block_tables[tables.index]))
        if skipped <= done:
            return
        table = request.block_tables[tables.index]
        assert self.pool.null_block is not None
        self.pool.free([self.pool.blocks[table[i]] for i in range(skipped - 1, done - 1, -1)])
        table[done:skipped] = [self.pool.null_block.block_id] * (skipped - done)
        request.num_skipped_blocks[tables.index] = skipped

    def cache_computed_blocks(self, request: Request) -> None:
        """Index the request's full blocks whose KV is now computed, in every group that
        still holds them."""
        if not self.enable_prefix_caching:
            return
        full = request.num_computed_tokens // self.block_size
        tokens = request.all_token_ids
        for index in range(len(request.block_hashes), full):
            parent = request.block_hashes[-1] if request.block_hashes else None
            start = index * self.block_size
            block_tokens = tokens[start : start + self.block_size]
            block_hash = self.chain_hash(parent or request.prefix_root, block_tokens)
            for group, table in enumerate(request.block_tables):
                if index >= request.num_skipped_blocks[group]:
                    block = self.pool.blocks[table[index]]
                    self.pool.cache(
                        block,
                        block_hash,
                        parent,
                        block_tokens,
                        group,
                        request.lora_id,
                        request.lora_name,
                    )
            request.block_hashes.append(block_hash)

    def free_past_computed(self, request: Request) -> None:
        """Release the blocks past those of the request's computed tokens, tail first: the
        blocks that only rejected draft tokens used (speculative decoding)."""
        keep = cdiv(request.num_computed_tokens, self.block_size)
        for group, table in enumerate(request.block_tables):
            if len(table) > keep:  # every step of every request comes here: mostly not
                self.pool.free([self.pool.blocks[i] for i in reversed(table[keep:])])
                request.block_tables[group] = table[:keep]  # a new list: see Request

    def free(self, request: Request) -> None:
        """Release the request's blocks, each table tail first, and its state slot; empty
        its tables."""
        for table, skipped in zip(request.block_tables, request.num_skipped_blocks, strict=True):
            self.pool.free([self.pool.blocks[i] for i in reversed(table[skipped:])])
        request.block_tables = []
        request.num_skipped_blocks = []
        request.block_hashes = []
        if self.slots is not None and request.state_slot is not None:
            self.slots.free(request.state_slot)
            request.state_slot = None

    @property
    def usage(self) -> float:
        """The fuller of the blocks and the state slots (either one running out stops
        admission)."""
        if self.slots is None:
            return self.pool.usage
        return max(self.pool.usage, self.slots.usage)
