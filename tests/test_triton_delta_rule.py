"""The Triton gated delta rule (chunked prefill, recurrent decode) against the float64
token-by-token recurrence of tests/delta_rule_reference.py, on the GPU or in Triton's
interpreter (tests/conftest.py).

Shapes are tiny but odd: ``Dk`` 24 and ``Dv`` 48 leave masked lanes in the key block and a
second, half-masked value block; two value heads per key head. The ragged batch holds
sequences shorter than, equal to and spanning several 64-token chunks, some from a prior
state. float32: worst error measured 1.4e-6 (outputs and states of order 1); bound 1e-4.
"""

import itertools

import torch

from kvserve.engine.kernels.triton_delta_rule import (
    CHUNK_SIZE,
    chunked_delta_rule,
    delta_rule_step,
)

from delta_rule_reference import random_inputs, recurrent_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HK, HV, DK, DV = 2, 4, 24, 48
ATOL = 1e-4


def on_device(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.to(DEVICE) for name, t in x.items()}


def test_chunked_ragged_batch_matches_recurrence():
    lens = [10, CHUNK_SIZE, 1, 2 * CHUNK_SIZE + 22]
    cu = [0, *itertools.accumulate(lens)]
    x = random_inputs(cu[-1], HK, HV, DK, DV)
    slots = torch.tensor([3, 0, 5, 1], dtype=torch.int32)
    has_state = torch.tensor([True, False, True, True])
    before = torch.randn(6, HV, DK, DV)
    state = before.clone().to(DEVICE)
    out = chunked_delta_rule(
        **on_device(x),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEVICE),
        state=state,
        slots=slots.to(DEVICE),
        has_state=has_state.to(DEVICE),
    ).cpu()
    state = state.cpu()
    for i, (a, b) in enumerate(itertools.pairwise(cu)):
        initial = before[slots[i]] if has_state[i] else None
        ref_o, ref_s = recurrent_reference(*(t[a:b] for t in x.values()), initial)
        torch.testing.assert_close(out[a:b].double(), ref_o, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].double(), ref_s, atol=ATOL, rtol=0)
    assert torch.equal(state[[2, 4]], before[[2, 4]])


def test_decode_steps_after_prefill_equal_one_pass():
    x = random_inputs(CHUNK_SIZE + 5, HK, HV, DK, DV, seed=1)
    prompt = CHUNK_SIZE + 2
    state = torch.zeros(2, HV, DK, DV, device=DEVICE)
    slot = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    chunked_delta_rule(
        **on_device({n: t[:prompt] for n, t in x.items()}),
        cu_seqlens=torch.tensor([0, prompt], dtype=torch.int32, device=DEVICE),
        state=state,
        slots=slot,
        has_state=torch.tensor([False], device=DEVICE),
    )
    yes = torch.tensor([True], device=DEVICE)
    steps = [
        delta_rule_step(
            *on_device({n: t[i : i + 1] for n, t in x.items()}).values(), state, slot, yes
        ).cpu()
        for i in range(prompt, CHUNK_SIZE + 5)
    ]
    ref_o, ref_s = recurrent_reference(*x.values(), None)
    torch.testing.assert_close(torch.cat(steps).double(), ref_o[prompt:], atol=ATOL, rtol=0)
    torch.testing.assert_close(state[1].cpu().double(), ref_s, atol=ATOL, rtol=0)


def test_step_batch_from_slots_with_and_without_prior_state():
    x = random_inputs(3, HK, HV, DK, DV, seed=2)
    before = torch.randn(4, HV, DK, DV)
    state = before.clone().to(DEVICE)
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    has_state = torch.tensor([False, True, True])
    out = delta_rule_step(
        **on_device(x), state=state, slots=slots.to(DEVICE), has_state=has_state.to(DEVICE)
    ).cpu()
    for i in range(3):
        initial = before[slots[i]] if has_state[i] else None
        ref_o, ref_s = recurrent_reference(*(t[i : i + 1] for t in x.values()), initial)
        torch.testing.assert_close(out[i : i + 1].double(), ref_o, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].cpu().double(), ref_s, atol=ATOL, rtol=0)
    assert torch.equal(state[1].cpu(), before[1])
