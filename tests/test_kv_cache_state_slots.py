"""Recurrent-state slots of linear-attention models: taken at admission, given back at the
end or on preemption, counted by admission and usage."""

import logging

import pytest

from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import RequestStatus
from kvserve.engine.core.state_slots import StateSlots

from audit import audit_blocks
from factories import finish_step, make_request, make_scheduler


def test_a_request_takes_a_slot_at_admission_and_none_is_taken_when_none_is_free():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False, num_state_slots=2)
    a, b, c = make_request(4), make_request(4), make_request(4)
    assert kv.allocate_slots(a, 4) and kv.allocate_slots(b, 4)
    assert (a.state_slot, b.state_slot, kv.usage) == (0, 1, 1.0)
    assert not kv.allocate_slots(c, 4)  # blocks are free, slots are not
    assert (c.state_slot, c.block_tables, kv.pool.num_free_blocks) == (None, [], 6)
    a.num_computed_tokens = 4
    assert kv.allocate_slots(a, 1) and a.state_slot == 0  # a running request keeps its slot
    kv.free(a)
    assert (a.state_slot, kv.slots.free_slots) == (None, [0])
    assert kv.allocate_slots(c, 4) and c.state_slot == 0


def test_prefix_caching_is_off_for_a_model_with_state_and_says_why(caplog):
    with caplog.at_level(logging.INFO):
        kv = KVCacheManager(8, 4, enable_prefix_caching=True, num_state_slots=2)
    assert not kv.enable_prefix_caching
    assert [r.message for r in caplog.records if "prefix caching is off" in r.message]
    assert kv.computed_blocks(make_request(tokens=list(range(1, 20)))).num_blocks == 0


def test_preemption_frees_the_slot_and_every_step_keeps_the_audit():
    s = make_scheduler(num_blocks=9, max_num_batched_tokens=16, max_num_seqs=3, num_state_slots=2)
    requests = [make_request(6, max_tokens=12) for _ in range(3)]
    for request in requests:
        s.add(request)
    while s.has_unfinished():
        out = s.schedule()
        audit_blocks(s)
        assert len(s.running) <= 2  # two slots
        for victim in out.preempted:
            assert (victim.status, victim.state_slot) == (RequestStatus.WAITING, None)
        finish_step(s, out)
        audit_blocks(s)
    assert s.stats.num_preemptions > 0
    assert all(r.num_output_tokens == 12 for r in requests)
    assert s.kv.slots.num_free == 2


def test_a_slot_freed_twice_is_an_error():
    slots = StateSlots(2)
    slot = slots.allocate()
    slots.free(slot)
    with pytest.raises(RuntimeError, match="freed but not held"):
        slots.free(slot)
    with pytest.raises(ValueError, match="num_state_slots"):
        StateSlots(0)
