"""The torch gated delta rule (the CPU path: chunked prefill, recurrent decode) against the
float64 token-by-token recurrence of tests/delta_rule_reference.py.

A ragged batch holds sequences shorter than, equal to and spanning several chunks, some
from a prior state in their slot; decode after prefill must equal one pass over the whole
sequence. float32 throughout: worst error measured 2.2e-7 (outputs and states of order 1);
bound 1e-4.
"""

import itertools

import torch

from kvserve.engine.kernels.delta_rule_torch import (
    gated_delta_rule_chunked,
    gated_delta_rule_step,
)

from delta_rule_reference import random_inputs, recurrent_reference

HK, HV, DK, DV = 2, 4, 16, 8
ATOL = 1e-4


def test_chunked_ragged_batch_matches_recurrence_with_and_without_initial_states():
    lens = [5, 16, 1, 37]  # chunk 16: shorter, equal, one token, three chunks
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    x = random_inputs(cu[-1], HK, HV, DK, DV)
    slots = torch.tensor([3, 0, 5, 1])
    has_state = torch.tensor([True, False, True, True])
    state = torch.randn(6, HV, DK, DV)
    before = state.clone()
    out = gated_delta_rule_chunked(
        **x, cu_seqlens=cu, state=state, slots=slots, has_state=has_state, chunk_size=16
    )
    for i, (a, b) in enumerate(itertools.pairwise(cu)):
        initial = before[slots[i]] if has_state[i] else None
        ref_o, ref_s = recurrent_reference(*(t[a:b] for t in x.values()), initial)
        torch.testing.assert_close(out[a:b].double(), ref_o, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].double(), ref_s, atol=ATOL, rtol=0)
    untouched = [2, 4]
    assert torch.equal(state[untouched], before[untouched])


def test_decode_steps_after_prefill_equal_one_pass():
    x = random_inputs(23, HK, HV, DK, DV, seed=1)
    state = torch.zeros(2, HV, DK, DV)
    slot, yes = torch.tensor([1]), torch.tensor([True])
    first = {n: t[:20] for n, t in x.items()}
    gated_delta_rule_chunked(
        **first,
        cu_seqlens=[0, 20],
        state=state,
        slots=slot,
        has_state=torch.tensor([False]),
        chunk_size=8,
    )
    steps = [
        gated_delta_rule_step(*(t[i : i + 1] for t in x.values()), state, slot, yes)
        for i in range(20, 23)
    ]
    ref_o, ref_s = recurrent_reference(*x.values(), None)
    torch.testing.assert_close(torch.cat(steps).double(), ref_o[20:], atol=ATOL, rtol=0)
    torch.testing.assert_close(state[1].double(), ref_s, atol=ATOL, rtol=0)


def test_step_batch_starts_from_zeros_without_a_prior_state():
    x = random_inputs(3, HK, HV, DK, DV, seed=2)
    state = torch.randn(4, HV, DK, DV)
    before = state.clone()
    slots = torch.tensor([2, 0, 3])
    has_state = torch.tensor([False, True, False])
    out = gated_delta_rule_step(**x, state=state, slots=slots, has_state=has_state)
    for i in range(3):
        initial = before[slots[i]] if has_state[i] else None
        ref_o, ref_s = recurrent_reference(*(t[i : i + 1] for t in x.values()), initial)
        torch.testing.assert_close(out[i : i + 1].double(), ref_o, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].double(), ref_s, atol=ATOL, rtol=0)
