"""Verification with the engine's sampler over logits whose argmax is known: the longest
run of drafts the target agrees with, then its own token; a stop inside the run ends it
there, with nothing appended after."""

import torch

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


def run(drafts, targets, **params):
    """A decoding request (prompt 1..7, token 8 out) verifying ``drafts`` against rows whose
    argmax are ``targets``: the request, what ``verify`` found, the scheduler."""
    scheduler = make_scheduler(num_blocks=16, block_size=4)
    request = make_request(tokens=[1, 2, 3, 4, 5, 6, 7], **{"max_tokens": 20, **params})
    scheduler.add(request)
    out = scheduler.schedule()
    scheduler.update(out, [8], {EOS})
    request.spec_token_ids = list(drafts)
    out = scheduler.schedule()
    sampler = Sampler([EOS])

    def sample(logits, requests):
        found = sampler(logits, requests)
        return {r.request_id: (t, None) for r, t in zip(requests, found.token_ids, strict=True)}, []

    verified = verify(
        peaked(*targets), out, sample, lambda r, t: scheduler.append_token(r, t, {EOS})
    )
    scheduler.advance(out, verified.num_rejected)
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
