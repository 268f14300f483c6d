"""Draft tokens in the scheduler and the KV cache: they spend the step's token budget, get
blocks like any token, and the blocks only rejected drafts used go back to the pool; the
prefix cache indexes accepted tokens only."""

from kvserve.engine.core.block_hash import sha256_chain

from audit import audit_blocks
from factories import make_request, make_scheduler


def decoding(scheduler):
    """A request past its prefill: 7 prompt tokens computed (blocks 0 and 1), token 8 out."""
    request = make_request(tokens=[1, 2, 3, 4, 5, 6, 7], max_tokens=20)
    scheduler.add(request)
    while request.num_tokens == 7:
        out = scheduler.schedule()
        scheduler.update(out, [8] * len(out.sampling_requests), {0})
    assert request.block_ids == [0, 1] and request.num_computed_tokens == 7
    return request


def test_drafts_are_scheduled_after_the_last_token_with_blocks_for_them():
    scheduler = make_scheduler(num_blocks=16, block_size=4)
    request = decoding(scheduler)
    request.spec_token_ids = [9, 10, 11, 12, 13]
    out = scheduler.schedule()
    assert out.scheduled == [(request, 6)]
    assert out.sampling_requests == [request]
    assert out.spec_token_ids == {request.request_id: [9, 10, 11, 12, 13]}
    assert out.input_token_ids(request, 6) == [8, 9, 10, 11, 12, 13]
    assert request.block_ids == [0, 1, 2, 3]  # positions 7..12
    audit_blocks(scheduler)


def test_the_token_budget_cuts_the_drafts():
    scheduler = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=3)
    request = decoding(scheduler)
    request.spec_token_ids = [9, 10, 11, 12]
    out = scheduler.schedule()
    assert out.scheduled == [(request, 3)]
    assert out.spec_token_ids == {request.request_id: [9, 10]}


def test_a_request_inside_its_prompt_schedules_no_drafts():
    scheduler = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=4)
    request = make_request(tokens=list(range(1, 11)))
    request.spec_token_ids = [1, 2]
    scheduler.add(request)
    out = scheduler.schedule()
    assert out.scheduled == [(request, 4)] and out.spec_token_ids == {}
    assert out.sampling_requests == []


def test_rejected_drafts_give_their_blocks_back_tail_first_and_are_not_cached():
    scheduler = make_scheduler(num_blocks=16, block_size=4, caching=True)
    request = decoding(scheduler)
    request.spec_token_ids = [9, 10, 11, 12, 13]
    out = scheduler.schedule()
    free_before = scheduler.kv.pool.free_block_ids
    for token in (9, 10, 50):  # two drafts accepted, then the target's own token
        scheduler.append_token(request, token, {0})
    scheduler.advance(out, {request.request_id: 3})
    assert request.num_computed_tokens == 10  # 8 + the two accepted drafts
    assert request.all_token_ids[7:] == [8, 9, 10, 50]
    assert request.block_ids == [0, 1, 2]
    assert scheduler.kv.pool.free_block_ids == [*free_before, 3]
    first = sha256_chain(None, [1, 2, 3, 4])
    assert request.block_hashes == [first, sha256_chain(first, [5, 6, 7, 8])]
    audit_blocks(scheduler)
    out = scheduler.schedule()  # the next step computes 50 where the drafts were
    assert out.input_token_ids(request, 1) == [50] and request.block_ids == [0, 1, 2]


def test_a_request_that_stops_inside_its_drafts_frees_everything():
    scheduler = make_scheduler(num_blocks=16, block_size=4)
    request = decoding(scheduler)
    request.spec_token_ids = [9, 0, 11]
    out = scheduler.schedule()
    for token in (9, 0):  # EOS (0) accepted as a draft: nothing after it
        scheduler.append_token(request, token, {0})
    scheduler.advance(out, {request.request_id: 1})
    assert request.is_finished and request.output_token_ids == [8, 9, 0]
    assert scheduler.running == [] and request.block_tables == []
    assert scheduler.kv.pool.num_free_blocks == 16
