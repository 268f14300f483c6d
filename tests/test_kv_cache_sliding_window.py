"""Sliding-window groups: blocks that leave the window go back to the pool while a request
runs, prefix hits need only the blocks the next query reads; by exact block ids."""

from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.kv_groups import FULL, SLIDING, KVGroup
from kvserve.engine.kv_events import BlockRemoved, BlockStored, KVEventLog

from audit import audit_blocks
from factories import finish_step, make_request, make_scheduler

SLIDE = (KVGroup(SLIDING, 6, (0,)),)
HYBRID = (KVGroup(FULL, None, (0,)), KVGroup(SLIDING, 6, (1,)))


def advance(kv: KVCacheManager, request, token: int = 5) -> None:
    """Compute the request's next token and sample one more (a decode step)."""
    assert kv.allocate_slots(request, 1)
    request.num_computed_tokens += 1
    kv.cache_computed_blocks(request)
    request.all_token_ids.append(token)


def test_blocks_before_the_window_return_to_the_pool_and_the_null_block_takes_their_place():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False, groups=SLIDE)
    assert kv.pool.free_block_ids == [1, 2, 3, 4, 5, 6, 7]  # block 0 is the null block
    a = make_request(10)
    assert kv.allocate_slots(a, 10)
    assert a.block_ids == [1, 2, 3]
    a.num_computed_tokens = 10
    a.all_token_ids.append(5)
    assert kv.allocate_slots(a, 1)  # the query at 10 reads 5..10: block 1 (0..3) is out
    assert (a.block_ids, kv.pool.free_block_ids) == ([0, 2, 3], [4, 5, 6, 7, 1])
    for _ in range(3):
        advance(kv, a)  # computes 10, 11, 12
    assert a.block_ids == [0, 2, 3, 4]
    assert kv.allocate_slots(a, 1)  # the query at 13 reads 8..13: block 2 (4..7) is out
    assert (a.block_ids, kv.pool.free_block_ids) == ([0, 0, 3, 4], [5, 6, 7, 1, 2])
    kv.free(a)
    assert (a.block_tables, kv.pool.free_block_ids) == ([], [5, 6, 7, 1, 2, 4, 3])


def test_a_long_request_holds_a_flat_number_of_blocks_once_past_the_window():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=False, groups=SLIDE)
    a = make_request(3)
    assert kv.allocate_slots(a, 3)
    a.num_computed_tokens = 3
    held = []
    for _ in range(200):  # 200 tokens through 5 usable blocks
        advance(kv, a)
        held.append(kv.pool.num_usable_blocks - kv.pool.num_free_blocks)
    assert max(held[8:]) == 3 and min(held[8:]) == 2


def test_a_hybrid_request_takes_a_block_per_group_and_drops_only_the_sliding_ones():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False, groups=HYBRID)
    a = make_request(9)
    assert kv.allocate_slots(a, 9)
    assert a.block_tables == [[1, 2, 3], [4, 5, 6]]
    a.num_computed_tokens = 9
    for _ in range(4):
        advance(kv, a)  # computes 9..12; 12 needs a fourth block
    assert a.block_tables == [[1, 2, 3, 7], [0, 5, 6, 8]]
    assert kv.allocate_slots(a, 1)  # the query at 13 reads 8..13
    assert a.block_tables == [[1, 2, 3, 7], [0, 0, 6, 8]]
    assert kv.blocks_needed(13) == 4 + 4  # at most: the whole prompt in one step
    kv.max_step_tokens = 4
    assert kv.blocks_needed(1000) == 250 + 4  # a window of 6 + a chunk of 4


def test_a_prefix_hit_needs_only_the_window_of_its_first_query_still_cached():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=True, groups=SLIDE)
    a = make_request(tokens=list(range(100, 108)))
    assert kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    kv.cache_computed_blocks(a)
    a.all_token_ids.append(108)
    for token in (109, 110, 111, 112, 113):
        advance(kv, a, token)
    # a computed 0..12; its block 1 (0..3) left the window and is free but still cached
    assert a.block_ids == [0, 2, 3, 4] and kv.pool.free_block_ids == [5, 1]
    b = make_request(tokens=[*a.all_token_ids[:12], 99])
    hit = kv.computed_blocks(b)  # the query at 12 reads 7..12: blocks 2 and 3
    assert hit.num_blocks == 3
    assert [[x.block_id for x in group] for group in hit.blocks] == [[0, 2, 3]]
    assert kv.allocate_slots(b, 1, hit)
    assert (b.block_ids, b.num_skipped_blocks) == ([0, 2, 3, 5], [1])
    assert [kv.pool.blocks[i].ref_count for i in (1, 2, 3)] == [0, 2, 2]
    c = make_request(tokens=[*range(100, 108), 77])
    hit = kv.computed_blocks(c)  # reads 3..8: block 1 is reclaimed from the free queue
    assert [[x.block_id for x in group] for group in hit.blocks] == [[1, 2]]


def test_a_hit_shrinks_to_where_every_group_has_what_it_reads():
    kv = KVCacheManager(num_blocks=11, block_size=4, enable_prefix_caching=True, groups=HYBRID)
    a = make_request(tokens=list(range(100, 117)))
    assert kv.allocate_slots(a, 17)
    assert a.block_tables == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    a.num_computed_tokens = 17
    kv.cache_computed_blocks(a)  # 4 full blocks in each group
    keys = list(a.block_hashes)
    kv.free(a)
    others = [kv.pool.blocks[i] for i in kv.pool.free_block_ids if i != 8]
    kv.pool.touch(others)
    kv.pool.free(others)  # sliding block 8 (positions 8..11) is next in line
    assert [b.block_id for b in kv.pool.allocate(1)] == [8]
    assert kv.pool.lookup(keys[2], group=1) is None
    b = make_request(tokens=[*range(100, 116), 7])
    hit = kv.computed_blocks(b)
    # a hit of 4 would read sliding positions 11..15 (block 8 among them); one of 2 reads
    # 3..7, still cached: the full group's hit shrinks to match
    assert hit.num_blocks == 2
    assert [[x.block_id for x in g] for g in hit.blocks] == [[1, 2], [6, 7]]


def test_scheduled_sliding_requests_keep_the_audit_through_chunks_and_preemption():
    s = make_scheduler(
        num_blocks=30,
        max_num_batched_tokens=7,
        max_num_seqs=3,
        max_model_len=512,
        caching=True,
        groups=HYBRID,
    )
    prompts = [list(range(1, 30)), list(range(1, 20)), [3] * 11]
    requests = [make_request(tokens=p, max_tokens=40) for p in prompts]
    for request in requests:
        s.add(request)
    steps = 0
    while s.has_unfinished():
        out = s.schedule()
        audit_blocks(s)
        finish_step(s, out, token=7)
        audit_blocks(s)
        steps += 1
    assert all(r.num_output_tokens == 40 for r in requests)
    assert s.stats.num_preemptions > 0
    assert s.kv.pool.num_free_blocks == s.kv.pool.num_usable_blocks


def test_kv_events_report_the_full_attention_groups_blocks_alone():
    log = KVEventLog()
    kv = KVCacheManager(16, 4, enable_prefix_caching=True, events=log, groups=HYBRID)
    a = make_request(tokens=list(range(100, 109)))
    assert kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.cache_computed_blocks(a)  # two full blocks, cached in both groups
    assert [kv.pool.lookup(h, group=1) is not None for h in a.block_hashes] == [True, True]
    keys = list(a.block_hashes)
    assert log.take() == [BlockStored(keys, None, list(range(100, 108)), 4)]
    kv.free(a)
    kv.pool.allocate(kv.pool.num_usable_blocks)  # evicts every block of both groups
    assert log.take() == [BlockRemoved(list(reversed(keys)))]
