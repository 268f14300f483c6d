"""Block tables of requests over the block pool, with prefix caching."""

from kvserve.engine.cdiv import cdiv
from kvserve.engine.core.block_hash import HASH_ALGOS, BlockHash
from kvserve.engine.core.block_pool import Block, BlockPool
from kvserve.engine.core.request import Request
from kvserve.engine.kv_events import KVEventLog


class KVCacheManager:
    """Gives each request the blocks its tokens need.

    A request's table (``request.block_ids``) covers its first
    ``num_computed_tokens`` (+ the tokens scheduled this step) tokens. With
    prefix caching on, full blocks are indexed by their chained content hash
    (``block_hash``; the algorithm named by ``hash_algo``) once their KV has been
    computed, and a new request starts from the longest cached run of its prompt's
    full blocks (never the whole prompt: its last token is always computed, to
    produce the logits of the first output token). A request under a LoRA adapter chains
    its first block on the adapter's key (``Request.prefix_root``), so two adapters, or an
    adapter and the base model, never share a block.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        events: KVEventLog | None = None,
        hash_algo: str = "sha256",
    ) -> None:
        self.block_size = block_size
        self.chain_hash = HASH_ALGOS[hash_algo]
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_prefix_caching, events)

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def computed_blocks(self, request: Request) -> list[Block]:
        """The cached blocks that hold a prefix of a request that has none computed yet
        (none for a request that wants prompt logprobs: those need every position computed)."""
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        hits: list[Block] = []
        parent: BlockHash | None = request.prefix_root
        tokens = request.all_token_ids
        for start in range(0, request.num_tokens - 1 - self.block_size + 1, self.block_size):
            parent = self.chain_hash(parent, tokens[start : start + self.block_size])
            block = self.pool.lookup(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: list[Block] | None = None
    ) -> bool:
        """Extend the request's table (after adopting ``computed`` prefix hits) to
        cover ``num_new_tokens`` more tokens. All or nothing: False, and no change,
        when the free blocks do not suffice."""
        computed = computed or []
        covered = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        new_count = self.blocks_needed(covered) - len(request.block_ids) - len(computed)
        reclaimed = sum(1 for b in computed if b.ref_count == 0)
        if new_count > self.pool.num_free_blocks - reclaimed:
            return False
        self.pool.touch(computed)
        request.block_ids.extend(b.block_id for b in computed)
        for block in computed:
            assert block.block_hash is not None  # a prefix hit is a cached block
            request.block_hashes.append(block.block_hash)
        request.block_ids.extend(b.block_id for b in self.pool.allocate(new_count))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Index the request's full blocks whose KV is now computed."""
        if not self.enable_prefix_caching:
            return
        full = request.num_computed_tokens // self.block_size
        tokens = request.all_token_ids
        for index in range(len(request.block_hashes), full):
            parent = request.block_hashes[-1] if request.block_hashes else None
            start = index * self.block_size
            block_tokens = tokens[start : start + self.block_size]
            block_hash = self.chain_hash(parent or request.prefix_root, block_tokens)
            self.pool.cache(
                self.pool.blocks[request.block_ids[index]], block_hash, parent, block_tokens
            )
            request.block_hashes.append(block_hash)

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, and empty its table."""
        self.pool.free([self.pool.blocks[i] for i in reversed(request.block_ids)])
        request.block_ids = []
        request.block_hashes = []

    @property
    def usage(self) -> float:
        return self.pool.usage
