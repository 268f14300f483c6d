"""Block-accounting invariants, checked against an engine's live state."""

from collections import Counter

from kvserve.engine.llm_engine import LLMEngine


def audit_blocks(engine: LLMEngine) -> None:
    """Every block's ref count equals the number of running requests holding it;
    a block is free exactly when nobody holds it; no request holds a block twice."""
    pool = engine.kv.pool
    holders = Counter()
    for request in engine.scheduler.running:
        assert len(set(request.block_ids)) == len(request.block_ids), request.block_ids
        holders.update(request.block_ids)
    for request in engine.scheduler.waiting:
        assert request.block_ids == []
    for block in pool.blocks:
        assert block.ref_count == holders[block.block_id], block
    unreferenced = [b.block_id for b in pool.blocks if b.ref_count == 0]
    assert sorted(pool.free_block_ids) == unreferenced


def assert_all_released(engine: LLMEngine) -> None:
    pool = engine.kv.pool
    assert not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_count == 0 for b in pool.blocks)
