"""Each running request's sampling parameters in a row (``ParamRows``): written once when a
request takes a row, gathered by row each call, and never read stale after a row passes to
another request, on the host or in the device copy."""

import numpy as np
import torch

from kvserve.engine.sampler import Sampler
from kvserve.engine.sampling_params import MAX_TOP_K
from kvserve.engine.sampling_rows import GREEDY, TEMPERATURE, TOP_K, TOP_P, param_row
from kvserve.engine.sampling_state import SamplingState

from factories import make_request


def test_rows_are_filled_when_taken_and_freed_with_their_request():
    state = SamplingState()
    a = make_request(2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.1)
    b = make_request(2, temperature=0)
    step = state.rows([a, b]).params
    assert step.rows == [0, 1]
    assert step.host.tolist() == [[0.7, 5, 0.9, 0.1, 0.0], [1.0, MAX_TOP_K, 1.0, 0.0, 1.0]]
    assert state.rows([b, a]).params.rows == [1, 0]  # held from call to call
    assert (step.greedy, state.rows([b]).params.greedy) == (False, True)
    state.free(a)
    c = make_request(2, temperature=1.5, top_p=0.5)
    step_c = state.rows([c]).params
    assert step_c.rows == [0]  # a's row, now c's
    assert state.params.host[0].tolist() == param_row(c.params)
    assert step.host[0].tolist() == param_row(a.params)  # the earlier call kept its copy
    state.free(b)
    state.free(c)
    state.free(c)  # a request freed twice gives its row back once
    assert sorted(state.params._free) == list(range(16))


def test_a_reused_row_samples_with_its_new_owners_parameters():
    """The old owner samples greedily (its row's argmax: token 1); the new one, on the same
    row, samples with a seed and top-k 3 (three close logits): exactly the tokens a fresh
    sampler gives it."""
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    logits[0, [1, 2, 3]] = torch.tensor([10.0, 9.8, 9.6])
    sampler = Sampler()
    old = make_request(2, temperature=0)
    assert sampler(logits, [old]).token_ids == [1]
    sampler.state.free(old)
    new = make_request(2, temperature=2.0, top_k=3, seed=7)
    twin = make_request(2, temperature=2.0, top_k=3, seed=7)
    tokens = [sampler(logits, [new]).token_ids[0] for _ in range(8)]
    assert sampler.state.rows([new]).params.rows == [0]
    assert tokens == [Sampler()(logits, [twin]).token_ids[0] for _ in range(8)]
    assert not sampler.state.params._pending  # no device copy: the writes are not kept
    assert set(tokens) == {1, 2, 3}


def test_the_device_copy_takes_a_row_write_only_in_the_calls_built_after_it():
    """Under async scheduling a call is built before the previous one samples: the earlier
    call still reads the old owner's row from the device copy, the later one the new."""
    state = SamplingState()
    state.params.copy_on_cpu = True
    old = make_request(2, temperature=0.5, top_k=4)
    first = state.rows([old]).params
    state.free(old)
    new = make_request(2, temperature=0)
    second = state.rows([new]).params
    assert first.rows == second.rows == [0]
    index = torch.tensor([0])
    read_first = state.params.device_rows(index, first.call)
    read_second = state.params.device_rows(index, second.call)
    assert read_first[0, [TEMPERATURE, TOP_K, GREEDY]].tolist() == [0.5, 4, 0]
    assert read_second[0, [TEMPERATURE, TOP_K, GREEDY]].tolist() == [1.0, MAX_TOP_K, 1]
    assert np.array_equal(read_second.numpy(), second.host)


def test_rows_grow_past_a_chunk_keeping_the_rows_held():
    state = SamplingState()
    state.params.copy_on_cpu = True
    requests = [make_request(2, temperature=1.0, top_p=(i + 1) / 40) for i in range(20)]
    step = state.rows(requests).params
    assert step.rows == list(range(20))
    assert state.params.host.shape == (32, 5)
    assert step.host[:, TOP_P].tolist() == [(i + 1) / 40 for i in range(20)]
    assert np.array_equal(state.params.device_rows(torch.arange(20), step.call), step.host)


def test_the_device_copy_path_samples_exactly_the_host_paths_tokens():
    """Call after call, as requests finish and others take their rows, a sampler reading
    its columns from the device copy (run on the CPU) gives exactly the host path's tokens."""
    kinds = [
        {"temperature": 0},
        {"temperature": 0.7, "top_k": 3},
        {"temperature": 1.3, "top_p": 0.6},
        {"temperature": 0.9, "min_p": 0.2},
        {"temperature": 1.0, "top_k": 5, "top_p": 0.8, "min_p": 0.05},
    ]
    host, copied = Sampler(), Sampler()
    copied.state.params.copy_on_cpu = True
    generator = torch.Generator().manual_seed(1)
    live: list[tuple] = []
    tokens: dict[str, list[list[int]]] = {"host": [], "copied": []}
    for call in range(12):
        if len(live) > 2:  # the oldest finishes: its row goes to the next request
            for sampler, request in zip((host, copied), live.pop(0), strict=True):
                sampler.state.free(request)
        kind = kinds[call % len(kinds)]
        live.append(tuple(make_request(2, seed=call, **kind) for _ in range(2)))
        logits = torch.randn(len(live), 20, generator=generator) * 3
        for name, sampler, side in (("host", host, 0), ("copied", copied, 1)):
            requests = [pair[side] for pair in live]
            tokens[name].append(sampler(logits, requests).token_ids)
    assert copied.state.params.on_device is not None and host.state.params.on_device is None
    assert tokens["copied"] == tokens["host"]
    assert len({t for call in tokens["host"] for t in call}) > 3
