"""Block tables and prefix caching, by exact block ids."""

from kvserve.engine.core.kv_cache_manager import KVCacheManager

from factories import make_request


def test_tables_grow_by_blocks_and_refuse_all_or_nothing():
    kv = KVCacheManager(num_blocks=5, block_size=4, enable_prefix_caching=False)
    a = make_request(6)
    assert kv.allocate_slots(a, 6)
    assert a.block_ids == [0, 1]
    a.num_computed_tokens = 6
    assert kv.allocate_slots(a, 2)  # positions 6, 7 still fit block 1
    assert a.block_ids == [0, 1]
    b = make_request(13)
    assert not kv.allocate_slots(b, 13)  # needs 4, 3 free: nothing taken
    assert (b.block_ids, kv.pool.num_free_blocks) == ([], 3)
    kv.free(a)
    assert (a.block_ids, kv.pool.num_free_blocks) == ([], 5)


def test_prefix_hits_reuse_the_same_physical_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    shared = list(range(100, 110))  # two full blocks and a half
    a = make_request(tokens=[*shared, 1, 2, 3])
    assert kv.computed_blocks(a).num_blocks == 0
    assert kv.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    kv.cache_computed_blocks(a)
    assert len(a.block_hashes) == 3  # 13 tokens: three full blocks
    b = make_request(tokens=[*shared, 7, 7, 7, 7])
    hits = kv.computed_blocks(b)
    assert [h.block_id for h in hits.blocks[0]] == a.block_ids[:2]
    assert kv.allocate_slots(b, b.num_tokens - 8, hits)
    assert b.block_ids[:2] == a.block_ids[:2]
    assert b.block_ids[2:] == [4, 5]  # new blocks after a's 0..3
    assert [kv.pool.blocks[i].ref_count for i in a.block_ids] == [2, 2, 1, 1]


def test_freed_prefix_stays_cached_and_a_full_prompt_hit_still_computes_its_last_token():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    prompt = list(range(200, 208))  # exactly two blocks
    a = make_request(tokens=prompt)
    kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    kv.cache_computed_blocks(a)
    table = list(a.block_ids)
    kv.free(a)
    assert kv.pool.num_free_blocks == 8
    again = make_request(tokens=prompt)
    hits = kv.computed_blocks(again)
    assert [h.block_id for h in hits.blocks[0]] == table[:1]  # never the whole prompt
    assert kv.allocate_slots(again, 4, hits)
    assert again.block_ids == [table[0], 2]  # the last block is recomputed in a fresh one


def test_lru_eviction_takes_the_least_recently_freed_cached_block():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_request(tokens=[1, 2, 3, 4, 5])
    kv.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    kv.cache_computed_blocks(a)  # blocks 0 and 1 cached, block 2 partial
    kv.free(a)  # freed tail first: 2, 1, 0 join the queue after 3
    b = make_request(tokens=[9, 9, 9, 9])
    assert kv.computed_blocks(b).num_blocks == 0
    kv.allocate_slots(b, 4)
    assert b.block_ids == [3, 2]  # never-cached blocks go before a's cached prefix
    c = make_request(tokens=[1, 2, 3, 4, 8])
    assert [h.block_id for h in kv.computed_blocks(c).blocks[0]] == [0, 1]
