"""Verification with the engine's sampler over logits whose argmax is known: the longest
run of drafts the target agrees with, then its own token; a stop inside the run ends it
there, with nothing appended after."""

import torch

from kvserve.engine.host_copy import HostCopies
from kvserve.engine.sampler import Sampler
from kvserve.engine.spec_decode.verifier import verify

from factories import make_request, make_scheduler

VOCAB = 64
EOS = 0


def peaked(*tokens: int) -> torch.Tensor:
    """One logits row per token, its argmax at that token."""
    logits = torch.zeros(len(tokens), VOCAB)
    logits[range(len(tokens)), list(tokens)] = 5.0
    return logits


def run_batch(*cases):
    """Decoding requests (prompt 1..7, token 8 out), each ``(drafts, targets, params)``,
    verifying its drafts against rows whose argmax are its targets: the requests, what
    ``verify`` found, the scheduler, the requests of each ``sample`` call and the
    device → host copies ``verify`` made."""
    scheduler = make_scheduler(num_blocks=16, block_size=4)
    requests = [
        make_request(tokens=[1, 2, 3, 4, 5, 6, 7], **{"max_tokens": 20, **params})
        for _, _, params in cases
    ]
    for request in requests:
        scheduler.add(request)
    out = scheduler.schedule()
    scheduler.update(out, [8] * len(requests), {EOS})
    for request, (drafts, _, _) in zip(requests, cases, strict=True):
        request.spec_token_ids = list(drafts)
    out = scheduler.schedule()
    sampler = Sampler([EOS])
    calls = []

    def sample(logits, batch):
        calls.append([r.request_id for r in batch])
        found = sampler(logits, batch)
        return {r.request_id: (t, None) for r, t in zip(batch, found.token_ids, strict=True)}, []

    copies = HostCopies.count
    verified = verify(
        peaked(*(t for _, targets, _ in cases for t in targets)),
        out,
        sample,
        lambda r, t: scheduler.append_token(r, t, {EOS}),
    )
    copies = HostCopies.count - copies
    scheduler.advance(out, verified.num_rejected)
    return requests, verified, scheduler, calls, copies


def run(drafts, targets, **params):
    """``run_batch`` of one request: the request, what ``verify`` found, the scheduler."""
    (request,), verified, scheduler, _, _ = run_batch((drafts, targets, params))
    return request, verified, scheduler


def test_the_matching_prefix_and_the_target_token_after_it():
    request, verified, _ = run([9, 10, 11], [9, 10, 42, 43])
    assert request.output_token_ids == [8, 9, 10, 42]
    assert verified.num_rejected == {request.request_id: 1}
    assert verified.runs == [(3, 2)]
    assert request.num_computed_tokens == 10


def test_all_drafts_accepted_add_the_bonus_token():
    request, verified, _ = run([9, 10, 11], [9, 10, 11, 12])
    assert request.output_token_ids == [8, 9, 10, 11, 12]
    assert verified.runs == [(3, 3)] and request.num_computed_tokens == 11


def test_a_first_mismatch_keeps_only_the_target_token():
    request, verified, _ = run([9, 10, 11], [30, 10, 11, 12])
    assert request.output_token_ids == [8, 30]
    assert verified.runs == [(3, 0)] and request.num_computed_tokens == 8


def test_eos_inside_the_accepted_run_ends_it():
    request, _, scheduler = run([9, EOS, 11], [9, EOS, 11, 12])
    assert request.output_token_ids == [8, 9, EOS]
    assert request.finish_reason == "stop" and scheduler.running == []
    assert scheduler.kv.pool.num_free_blocks == 16


def test_a_stop_id_inside_the_accepted_run_ends_it():
    request, _, _ = run([9, 10, 11], [9, 10, 11, 12], stop_token_ids=[10])
    assert request.output_token_ids == [8, 9, 10]
    assert (request.finish_reason, request.stop_reason) == ("stop", 10)


def test_max_tokens_inside_the_accepted_run_ends_it():
    request, _, _ = run([9, 10, 11], [9, 10, 11, 12], max_tokens=3)
    assert request.output_token_ids == [8, 9, 10]
    assert request.finish_reason == "length"


def test_plain_greedy_requests_verify_with_one_host_copy_and_no_sampler_call():
    (a, b), verified, _, calls, copies = run_batch(
        ([9, 10, 11], [9, 10, 42, 43], {}), ([20, 21], [20, 21, 22], {})
    )
    assert a.output_token_ids == [8, 9, 10, 42] and b.output_token_ids == [8, 20, 21, 22]
    assert verified.num_rejected == {a.request_id: 1, b.request_id: 0}
    assert verified.runs == [(3, 2), (2, 2)]
    assert calls == [] and copies == 1


def test_biased_and_plain_requests_of_one_batch_each_keep_their_rule():
    # the bias lifts token 50 above the peaked 9 of the biased request's second row
    (plain, biased), verified, _, calls, _ = run_batch(
        ([9, 9, 9], [9, 9, 9, 9], {}), ([9, 9, 9], [9, 9, 9, 9], {"logit_bias": {50: 5.5}})
    )
    assert plain.output_token_ids == [8, 9, 9, 9, 9]
    assert biased.output_token_ids == [8, 50]
    assert verified.runs == [(3, 3), (3, 0)]
    assert calls == [[biased.request_id]]


def test_min_tokens_not_reached_bans_eos_at_every_position():
    # at the second position EOS is banned: the argmax of the rest (all 0) is token 1
    request, verified, _ = run([9, EOS, 11], [9, EOS, 11, 12], min_tokens=5)
    assert request.output_token_ids == [8, 9, 1]
    assert request.finish_reason is None and verified.runs == [(3, 1)]
