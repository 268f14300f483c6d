"""Scheduling policy: the token budget, chunking, preemption order, stop rules."""

import pytest

from kvserve.engine.core.request import RequestStatus

from factories import finish_step, make_request, make_scheduler


def plan(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_budget_is_spent_on_running_requests_first_then_waiting_ones_in_chunks():
    s = make_scheduler(max_num_batched_tokens=64)
    a, b, c = (make_request(30) for _ in range(3))
    for r in (a, b, c):
        s.add(r)
    out = s.schedule()
    assert plan(out) == [(a.request_id, 30), (b.request_id, 30), (c.request_id, 4)]
    assert out.num_batched_tokens == 64
    assert out.sampling_requests == [a, b]  # c's prompt is not done: no token yet
    finish_step(s, out)
    out = s.schedule()
    assert plan(out) == [(a.request_id, 1), (b.request_id, 1), (c.request_id, 26)]
    finish_step(s, out)
    assert (c.output_token_ids, c.num_computed_tokens) == ([99], 30)


def test_long_prefill_threshold_spreads_a_prompt_over_steps_beside_the_running_decodes():
    s = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=12)
    a = make_request(10, max_tokens=8)
    s.add(a)
    finish_step(s, s.schedule())  # a's 10-token prompt is under the threshold: one step
    b, c = make_request(30), make_request(5)
    s.add(b)
    s.add(c)
    out = s.schedule()
    assert plan(out) == [(a.request_id, 1), (b.request_id, 12), (c.request_id, 5)]
    assert out.sampling_requests == [a, c]
    finish_step(s, out)
    out = s.schedule()
    assert plan(out) == [(a.request_id, 1), (b.request_id, 12), (c.request_id, 1)]
    finish_step(s, out)
    out = s.schedule()
    assert plan(out) == [(a.request_id, 1), (b.request_id, 6), (c.request_id, 1)]
    assert out.sampling_requests == [a, b, c]


def test_long_prefill_threshold_is_checked():
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be >= 0, got -1"):
        make_scheduler(long_prefill_token_threshold=-1)


def test_max_num_seqs_caps_the_running_set():
    s = make_scheduler(max_num_seqs=2)
    requests = [make_request(4) for _ in range(3)]
    for r in requests:
        s.add(r)
    out = s.schedule()
    assert [r for r, _ in out.scheduled] == requests[:2]
    assert list(s.waiting) == requests[2:]


def test_out_of_blocks_preempts_the_latest_request_and_recomputes_it_later():
    s = make_scheduler(num_blocks=6, block_size=4)
    a, b, c = (make_request(8, max_tokens=8) for _ in range(3))
    for r in (a, b, c):
        s.add(r)
    finish_step(s, s.schedule())
    assert (a.block_ids, b.block_ids, c.block_ids) == ([0, 1], [2, 3], [4, 5])
    out = s.schedule()  # each needs a third block for its 9th token
    assert out.preempted == [c]
    assert plan(out) == [(a.request_id, 1), (b.request_id, 1)]
    assert (a.block_ids, b.block_ids) == ([0, 1, 5], [2, 3, 4])  # c's tail went first
    assert (c.status, c.block_ids, s.waiting[0]) == (RequestStatus.WAITING, [], c)
    assert (c.num_computed_tokens, c.output_token_ids) == (0, [99])
    assert s.stats.num_preemptions == 1
    finish_step(s, out)
    # c comes back as a 9-token prompt once blocks free up
    while c.status is not RequestStatus.RUNNING:
        finish_step(s, s.schedule())
    assert (a.is_finished, b.is_finished) == (True, True)
    assert (c.num_computed_tokens, c.output_token_ids) == (9, [99, 99])


def test_a_request_that_cannot_grow_preempts_itself_when_it_is_the_latest():
    s = make_scheduler(num_blocks=3, block_size=4)
    a, b = make_request(4, max_tokens=8), make_request(8, max_tokens=8)
    s.add(a)
    s.add(b)
    finish_step(s, s.schedule())
    assert (a.block_ids, b.block_ids) == ([0], [1, 2])
    out = s.schedule()  # a fits its 5th token? no free block: b (latest) goes
    assert (out.preempted, plan(out)) == ([b], [(a.request_id, 1)])


def test_stop_token_eos_and_length_finish_and_free():
    s = make_scheduler()
    stop = make_request(4, stop_token_ids=[7])
    eos = make_request(4)
    eos_ignored = make_request(4, ignore_eos=True, max_tokens=2)
    for r in (stop, eos, eos_ignored):
        s.add(r)
    out = s.schedule()
    s.update(out, [7, 0, 0], eos_token_ids={0})
    assert (stop.finish_reason, stop.stop_reason) == ("stop", 7)
    assert (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert not eos_ignored.is_finished
    finish_step(s, s.schedule())
    assert eos_ignored.finish_reason == "length"
    assert (s.kv.pool.num_free_blocks, s.has_unfinished()) == (64, False)


def test_context_limit_ends_a_request_with_length():
    s = make_scheduler(max_model_len=6)
    r = make_request(4, max_tokens=None)
    s.add(r)
    finish_step(s, s.schedule())
    finish_step(s, s.schedule())
    assert (r.finish_reason, r.num_tokens) == ("length", 6)


def test_abort_frees_blocks_wherever_the_request_is():
    s = make_scheduler(max_num_seqs=1)
    running, waiting = make_request(8), make_request(8)
    s.add(running)
    s.add(waiting)
    finish_step(s, s.schedule())
    s.abort(running)
    s.abort(waiting)
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert (s.has_unfinished(), s.kv.pool.num_free_blocks) == (False, 64)
