"""Gemma 3 and Gemma 4 sharded over two ranks (two processes, gloo on 127.0.0.1) compute the
logits of the unsharded model: their sliding-window and global layers, both RoPE bases, the
per-head q/k (and Gemma 4's v) norms, Gemma 4's per-layer input embeddings and the final
soft-cap included."""

import functools

import pytest
import torch

from kvserve.engine.layers.tensor_parallel import TensorParallel

from gemma_checkpoints import PER_LAYER_INPUTS, build_gemma3, build_gemma4
from sharded_steps import PROMPTS, on_two_ranks, run_steps

LONG = [(7 * i + 3) % 509 + 3 for i in range(21)]  # crosses the 8-token window twice
BUILDERS = {
    "gemma3": build_gemma3,
    "gemma4": build_gemma4,
    "gemma4-per-layer-inputs": functools.partial(build_gemma4, **PER_LAYER_INPUTS),
}


def logits(path, tp: TensorParallel) -> list[torch.Tensor]:
    return run_steps(path, tp, prompts=[*PROMPTS, LONG])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Each family's checkpoint, and what each of two ranks computed from it."""
    root = tmp_path_factory.mktemp("gemma-tp")
    paths = {
        name: build(root / name, seed=2, final_logit_softcapping=15.0)
        for name, build in BUILDERS.items()
    }
    return paths, on_two_ranks(logits, list(paths.values()), root)


@pytest.mark.parametrize("family", BUILDERS)
def test_two_ranks_compute_the_logits_of_one(two_ranks, family):
    paths, ranks = two_ranks
    expected = logits(paths[family], TensorParallel())
    got = ranks[0][family]
    assert [t.shape for t in got] == [t.shape for t in expected]
    for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        assert torch.equal(ours, ranks[1][family][step])
