"""The causal depthwise convolution with state (torch path and Triton kernel, the latter on
the GPU or in Triton's interpreter) against a float64 loop over each sequence's taps.

The ragged batch holds sequences of 1, 2 (fewer tokens than the state keeps, so part of the
old state stays), 3 and 37 tokens (several 16-token blocks), 70 channels (a second,
part-masked 64-channel block), some from a prior state; decode steps after a prefill must
equal one pass. float32: worst error measured 9e-7 (outputs up to about 10); bound 1e-5.
"""

import itertools

import pytest
import torch

from kvserve.engine.kernels import causal_conv1d_torch, triton_causal_conv1d

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CHANNELS, WIDTH = 70, 4
ATOL = 1e-5


def reference(
    x: torch.Tensor, weight: torch.Tensor, prior: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence ``x`` ``[L, C]`` after ``prior`` ``[C, K - 1]`` (zeros if None), float64:
    (outputs ``[L, C]``, the last ``K - 1`` inputs ``[C, K - 1]``)."""
    history = torch.zeros(CHANNELS, WIDTH - 1, dtype=torch.float64) if prior is None else prior
    inputs = torch.cat([history.double(), x.t().double()], dim=1)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for c in range(CHANNELS):
            y = sum(weight[c, j].double() * inputs[c, t + j] for j in range(WIDTH))
            out[t, c] = y * torch.sigmoid(y)
    return out, inputs[:, -(WIDTH - 1) :]


def run_prefill(path: str, x, weight, cu, state, slots, has_state):
    if path == "torch":
        return causal_conv1d_torch.causal_conv1d(x, weight, cu, state, slots, has_state)
    return triton_causal_conv1d.causal_conv1d(
        x.to(DEVICE),
        weight.to(DEVICE),
        torch.tensor(cu, dtype=torch.int32, device=DEVICE),
        state,
        slots.to(DEVICE),
        has_state.to(DEVICE),
    ).cpu()


def run_step(path: str, x, weight, state, slots, has_state):
    module = causal_conv1d_torch if path == "torch" else triton_causal_conv1d
    dev = torch.device("cpu") if path == "torch" else DEVICE
    return module.causal_conv1d_step(
        x.to(dev), weight.to(dev), state, slots.to(dev), has_state.to(dev)
    ).cpu()


PATHS = ["torch", "triton"]


@pytest.mark.parametrize("path", PATHS)
def test_ragged_prefill_matches_reference(path):
    lens = [1, 2, 3, 37]
    cu = [0, *itertools.accumulate(lens)]
    x = torch.randn(cu[-1], CHANNELS)
    weight = torch.randn(CHANNELS, WIDTH)
    slots = torch.tensor([4, 0, 2, 1], dtype=torch.int32)
    has_state = torch.tensor([True, True, False, True])
    before = torch.randn(5, CHANNELS, WIDTH - 1)
    state = before.clone().to(DEVICE if path == "triton" else "cpu")
    out = run_prefill(path, x, weight, cu, state, slots, has_state)
    state = state.cpu()
    for i, (a, b) in enumerate(itertools.pairwise(cu)):
        prior = before[slots[i]] if has_state[i] else None
        ref_out, ref_state = reference(x[a:b], weight, prior)
        torch.testing.assert_close(out[a:b].double(), ref_out, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].double(), ref_state, atol=ATOL, rtol=0)
    assert torch.equal(state[3], before[3])


@pytest.mark.parametrize("path", PATHS)
def test_decode_steps_after_prefill_equal_one_pass(path):
    x = torch.randn(9, CHANNELS)
    weight = torch.randn(CHANNELS, WIDTH)
    state = torch.full((2, CHANNELS, WIDTH - 1), float("nan"))
    state = state.to(DEVICE if path == "triton" else "cpu")
    slot = torch.tensor([1], dtype=torch.int32)
    prompt = run_prefill(path, x[:6], weight, [0, 6], state, slot, torch.tensor([False]))
    steps = [
        run_step(path, x[t : t + 1], weight, state, slot, torch.tensor([True])) for t in range(6, 9)
    ]
    ref_out, ref_state = reference(x, weight, None)
    torch.testing.assert_close(torch.cat([prompt, *steps]).double(), ref_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(state[1].cpu().double(), ref_state, atol=ATOL, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_step_batch_with_and_without_prior_state(path):
    x = torch.randn(3, CHANNELS)
    weight = torch.randn(CHANNELS, WIDTH)
    before = torch.randn(3, CHANNELS, WIDTH - 1)
    state = before.clone().to(DEVICE if path == "triton" else "cpu")
    slots = torch.tensor([2, 0, 1], dtype=torch.int32)
    has_state = torch.tensor([True, False, True])
    out = run_step(path, x, weight, state, slots, has_state)
    for i in range(3):
        prior = before[slots[i]] if has_state[i] else None
        ref_out, ref_state = reference(x[i : i + 1], weight, prior)
        torch.testing.assert_close(out[i : i + 1].double(), ref_out, atol=ATOL, rtol=0)
        torch.testing.assert_close(state[slots[i]].cpu().double(), ref_state, atol=ATOL, rtol=0)
