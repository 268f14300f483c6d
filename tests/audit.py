"""Block-accounting invariants, checked against an engine's live state."""

from collections import Counter

from joined_outputs import JoinedOutputs

from kvserve.engine.core.scheduler import Scheduler
from kvserve.engine.llm_engine import LLMEngine


def audit_blocks(engine: LLMEngine | Scheduler) -> None:
    """In every KV group: every block's ref count equals the number of running requests
    holding it; a block is free exactly when nobody holds it; no request holds a block
    twice; a table's null entries are exactly its dropped leading ones (sliding windows),
    and the null block is never free nor held. Every running request of a model with state
    slots holds one slot of its own; a waiting one holds nothing. The sampler's history
    slots are held only by running requests, one each."""
    scheduler = engine if isinstance(engine, Scheduler) else engine.scheduler
    kv = scheduler.kv
    pool = kv.pool
    null = pool.null_block.block_id if pool.null_block is not None else None
    holders: Counter[int] = Counter()
    for request in scheduler.running:
        assert len(request.block_tables) == len(kv.groups)
        held = []
        for table, skipped in zip(request.block_tables, request.num_skipped_blocks, strict=True):
            assert table[:skipped] == [null] * skipped, table
            assert null not in table[skipped:], table
            held.extend(table[skipped:])
        assert len(set(held)) == len(held), request.block_tables
        holders.update(held)
    for request in scheduler.waiting:
        assert (request.block_tables, request.state_slot) == ([], None)
    for block in pool.blocks:
        if block.block_id != null:
            assert block.ref_count == holders[block.block_id], block
    unreferenced = [b.block_id for b in pool.blocks if b.ref_count == 0 and b.block_id != null]
    assert sorted(pool.free_block_ids) == unreferenced
    if kv.slots is not None:
        slots = [r.state_slot for r in scheduler.running]
        assert None not in slots and len(set(slots)) == len(slots), slots
        assert sorted(kv.slots.free_slots + slots) == list(range(kv.slots.num_slots))
    if isinstance(engine, LLMEngine):
        history = engine.sampling_state
        holding = [r for r in scheduler.running if history.slot_of(r) is not None]
        assert history.num_held == len(holding)
        assert len({history.slot_of(r) for r in holding}) == len(holding)


def assert_all_released(engine: LLMEngine) -> None:
    pool = engine.kv.pool
    assert not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert all(b.ref_count == 0 for b in pool.blocks)
    slots = engine.kv.slots
    assert slots is None or slots.num_free == slots.num_slots
    assert engine.sampling_state.num_held == 0


def run_audited(engine: LLMEngine) -> dict[str, list[int]]:
    """Step ``engine`` until nothing is unfinished, auditing its blocks after every step and
    checking every block released at the end; each finished request's token ids."""
    finished, seen = {}, JoinedOutputs()
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
        audit_blocks(engine)
    assert_all_released(engine)
    return finished
