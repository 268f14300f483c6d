"""The sampler's history on the device (``SamplingState``): penalties and the ``min_tokens``
ban give exactly the logits of the host-list formula, call after call, as slots are handed
out, given back, reused and grown."""

import random

import pytest
import torch
from penalty_reference import host_list_logits

from kvserve.engine.core.request import Request
from kvserve.engine.sampler import Sampler
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.sampling_state import NULL_SLOT

VOCAB = 97
EOS = (0, 5)


def random_request(rng: random.Random, i: int) -> Request:
    kinds = [
        {},
        {"presence_penalty": rng.uniform(-2, 2)},
        {"frequency_penalty": rng.uniform(-2, 2)},
        {"repetition_penalty": rng.uniform(0.5, 2)},
        {"min_tokens": rng.randrange(1, 6), "stop_token_ids": (rng.randrange(VOCAB),)},
        {"logit_bias": {rng.randrange(VOCAB): rng.uniform(-5, 5)}},
    ]
    params: dict = {}
    for kind in rng.sample(kinds, rng.randrange(1, 4)):
        params |= kind
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
    request = Request(str(i), prompt, SamplingParams(temperature=0, max_tokens=64, **params))
    request.all_token_ids.extend(rng.randrange(VOCAB) for _ in range(rng.randrange(0, 8)))
    return request


@pytest.mark.parametrize("seed", range(6))
def test_adjusted_logits_equal_the_host_list_formula_bit_for_bit(seed):
    rng = random.Random(seed)
    requests = [random_request(rng, i) for i in range(9)]
    sampler = Sampler(EOS)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(6):  # the host appends each call's token, as the engine does
        logits = torch.randn(len(requests), VOCAB, generator=generator) * 4
        expected = host_list_logits(logits, requests, EOS)
        assert torch.equal(sampler.adjust_logits(logits, requests), expected)
        tokens = sampler(logits, requests).token_ids
        for request, token in zip(requests, tokens, strict=True):
            request.all_token_ids.append(token)


def test_requests_without_penalties_hold_no_slot_and_allocate_nothing():
    sampler = Sampler(EOS)
    plain = Request("a", [1, 2], SamplingParams(temperature=0, logit_bias={3: 1.0}))
    assert sampler.state.rows([plain]).slots == [NULL_SLOT]
    sampler(torch.randn(1, VOCAB), [plain])
    assert (sampler.state.num_held, sampler.state.counts) == (0, None)


def test_a_reused_slot_starts_from_its_new_owners_tokens():
    sampler = Sampler(EOS)
    old = Request("old", [1], SamplingParams(temperature=0, frequency_penalty=1.0))
    old.all_token_ids.extend([7, 7, 7])
    sampler(torch.randn(1, VOCAB), [old])
    slot = sampler.state.slot_of(old)
    sampler.state.free(old)
    new = Request("new", [2], SamplingParams(temperature=0, frequency_penalty=1.0))
    new.all_token_ids.append(9)
    logits = torch.randn(1, VOCAB)
    assert torch.equal(sampler.adjust_logits(logits, [new]), host_list_logits(logits, [new], EOS))
    assert sampler.state.slot_of(new) == slot


def test_a_preempted_request_is_set_again_from_its_host_tokens_when_it_resumes():
    sampler = Sampler(EOS)
    params = SamplingParams(temperature=0, presence_penalty=0.5, repetition_penalty=1.5)
    request = Request("r", [3, 4], params)
    for _ in range(3):
        token = sampler(torch.randn(1, VOCAB), [request]).token_ids[0]
        request.all_token_ids.append(token)
    sampler.state.free(request)  # preempted: its outputs stay on the host
    logits = torch.randn(1, VOCAB)
    got = sampler.adjust_logits(logits, [request])
    assert torch.equal(got, host_list_logits(logits, [request], EOS))


def test_growing_keeps_the_rows_held():
    sampler = Sampler(EOS)
    rng = random.Random(7)
    requests = [
        Request(str(i), [i], SamplingParams(temperature=0, frequency_penalty=0.3))
        for i in range(20)
    ]
    for request in requests:
        request.all_token_ids.extend(rng.randrange(VOCAB) for _ in range(5))
    for count in (3, 20):  # 16 slots, then 32
        logits = torch.randn(count, VOCAB)
        got = sampler.adjust_logits(logits, requests[:count])
        assert torch.equal(got, host_list_logits(logits, requests[:count], EOS))
    assert sampler.state.counts is not None and sampler.state.counts.shape == (32, VOCAB)


def test_min_tokens_are_counted_on_the_device_even_where_the_host_lags():
    """Async scheduling samples step N+1 before step N's token is on the host: the ban lifts
    when the device's count reaches ``min_tokens``."""
    sampler = Sampler(EOS)
    request = Request("r", [1], SamplingParams(temperature=0, min_tokens=2))
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS[0]] = 10.0
    first, second = (sampler(logits, [request]).token_ids[0] for _ in range(2))
    assert first != EOS[0] and second != EOS[0]
    assert request.num_output_tokens == 0  # nothing appended on the host: the device counts
    assert sampler(logits, [request]).token_ids == [EOS[0]]
