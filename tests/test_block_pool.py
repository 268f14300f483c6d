"""The block pool's policy, pinned down by exact block ids."""

import pytest

from kvserve.engine.core.block_pool import BlockPool
from kvserve.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventLog


def ids(blocks):
    return [b.block_id for b in blocks]


def test_allocates_from_the_front_and_frees_to_the_back():
    pool = BlockPool(6, enable_caching=False)
    first = pool.allocate(3)
    assert ids(first) == [0, 1, 2]
    assert (pool.num_free_blocks, pool.usage) == (3, pytest.approx(0.5))
    pool.free(list(reversed(first)))  # a table is freed tail first
    assert pool.free_block_ids == [3, 4, 5, 2, 1, 0]
    assert ids(pool.allocate(6)) == [3, 4, 5, 2, 1, 0]


def test_reference_counts_keep_shared_blocks_out_of_the_free_queue():
    pool = BlockPool(4, enable_caching=True)
    (block,) = pool.allocate(1)
    pool.cache(block, 1234, None, [1, 2])
    pool.touch([block])
    pool.free([block])
    assert (block.ref_count, pool.free_block_ids) == (1, [1, 2, 3])
    pool.free([block])
    assert (block.ref_count, pool.free_block_ids) == (0, [1, 2, 3, 0])
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([block])


def test_cached_blocks_stay_findable_until_evicted_least_recently_freed_first():
    pool = BlockPool(3, enable_caching=True)
    a, b, c = pool.allocate(3)
    for block, key in ((a, 10), (b, 11), (c, 12)):
        pool.cache(block, key, None, [key])
    pool.free([b, a, c])
    assert (pool.lookup(10), pool.lookup(11)) == (a, b)
    pool.touch([a])  # a hit takes a cached block back out of the free queue
    assert ids(pool.allocate(1)) == [b.block_id]  # b was freed first: evicted first
    assert (pool.lookup(11), b.block_hash) == (None, None)
    assert (pool.lookup(12), pool.free_block_ids) == (c, [c.block_id])


def test_duplicate_content_keeps_the_first_block():
    pool = BlockPool(2, enable_caching=True)
    a, b = pool.allocate(2)
    pool.cache(a, 7, None, [7])
    pool.cache(b, 7, None, [7])
    assert (pool.lookup(7), b.block_hash) == (a, None)


def test_caching_off_indexes_nothing():
    pool = BlockPool(2, enable_caching=False)
    (a,) = pool.allocate(1)
    pool.cache(a, 7, None, [7])
    assert pool.lookup(7) is None


def test_over_allocation_is_refused():
    pool = BlockPool(2, enable_caching=False)
    with pytest.raises(RuntimeError, match="asked for 3 blocks, 2 free"):
        pool.allocate(3)


def test_the_event_log_records_each_change_of_the_index_as_it_happens():
    log = KVEventLog()
    pool = BlockPool(4, enable_caching=True, events=log)
    a, b, c = pool.allocate(3)
    pool.cache(a, 10, None, [1, 2])
    pool.cache(b, 11, 10, [3, 4])  # the next block of the same chain joins a's event
    pool.cache(c, 10, None, [1, 2])  # a duplicate is not indexed: no event
    pool.cache(c, 20, 99, [5, 6])  # a block after some other parent starts a new event
    assert log.take() == [
        BlockStored([10, 11], None, [1, 2, 3, 4], 2),
        BlockStored([20], 99, [5, 6], 2),
    ]
    assert log.take() == []
    pool.free([c, b, a])  # queue: 3, c, b, a
    assert ids(pool.allocate(3)) == [3, c.block_id, b.block_id]
    assert log.take() == [BlockRemoved([20, 11])]  # two evictions in a row: one event
    assert not pool.reset_prefix_cache()  # blocks in use: refused, nothing recorded
    assert (log.take(), pool.lookup(10)) == ([], a)
    pool.free([pool.blocks[3], c, b])
    assert pool.reset_prefix_cache()
    assert log.take() == [AllBlocksCleared()]
    assert (pool.lookup(10), a.block_hash) == (None, None)
