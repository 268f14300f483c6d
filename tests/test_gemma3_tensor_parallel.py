"""Gemma 3 sharded over two ranks (two processes, gloo on 127.0.0.1) computes the logits of
the unsharded model, its sliding-window and global layers, both RoPE bases, the per-head q/k
norms and the final soft-cap included."""

import pytest
import torch

from kvserve.engine.layers.tensor_parallel import TensorParallel

from gemma_checkpoints import build_gemma3
from sharded_steps import PROMPTS, on_two_ranks, run_steps

LONG = [(7 * i + 3) % 509 + 3 for i in range(21)]  # crosses the 8-token window twice


def logits(path, tp: TensorParallel) -> list[torch.Tensor]:
    return run_steps(path, tp, prompts=[*PROMPTS, LONG])


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return build_gemma3(
        tmp_path_factory.mktemp("gemma3-tp") / "gemma3", seed=2, final_logit_softcapping=15.0
    )


def test_two_ranks_compute_the_logits_of_one(gemma3):
    expected = logits(gemma3, TensorParallel())
    ranks = on_two_ranks(logits, [gemma3], gemma3.parent)
    got = ranks[0][gemma3.name]
    assert [t.shape for t in got] == [t.shape for t in expected]
    for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        assert torch.equal(ours, ranks[1][gemma3.name][step])
