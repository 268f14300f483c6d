"""benchmarks/step_split.py on a tiny checkpoint: every phase and kernel call of a known
run is counted where it belongs."""

import importlib
import sys
from pathlib import Path

import pytest

from kvserve.engine.kernels import cpu_library

from checkpoints import build_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def step_split(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(cpu_library, "run", cpu_library.run)  # restored after the test
    yield importlib.import_module("step_split")
    sys.modules.pop("step_split", None)


@pytest.mark.parametrize("kernels", [False, True], ids=["phases", "kernels"])
def test_a_run_of_two_prompts_is_split_by_step_phase_and_kernel(tmp_path, step_split, kernels):
    """Two prompts (5 and 3 tokens), 3 tokens each: one prefill step for both, then two
    decode steps; the tiny model's 2 layers call the prefill kernel once each in the first
    step and the decode kernel once each in the others."""
    model = build_checkpoint("llama", tmp_path / "model")
    workload = step_split.Workload([[5, 6, 7, 8, 9], [10, 11, 12]], max_tokens=3)
    wall, split = step_split.run(model, "fp32", workload, kernels, False)
    assert split.calls["forward, prefill steps"] == 1
    assert split.calls["forward, decode steps"] == 2
    assert split.calls["LM head"] == split.calls["sample"] == 3
    assert split.calls["step"] == split.calls["schedule"] == split.calls["update"] == 3
    kernel_calls = {k: n for k, n in split.calls.items() if k.startswith("C ")}
    if kernels:
        assert kernel_calls["C paged_prefill"] == 2
        assert kernel_calls["C paged_decode"] == 4
    else:
        assert kernel_calls == {}
    assert split.calls["prefix-cache hashing"] == 0
    phases = sum(v for k, v in split.seconds.items() if not k.startswith("C ") and k != "step")
    assert 0 < phases <= split.seconds["step"] <= wall
    rows = step_split.table(split, wall)
    assert rows[2].startswith("| ") and any(r.startswith("| outside steps |") for r in rows)


def test_prefix_caching_times_each_block_key(tmp_path, step_split):
    """A 40-token prompt in blocks of 16: its admission hashes its first block and finds
    nothing cached, then its prefill caches two full blocks; 3 output tokens fill no other."""
    model = build_checkpoint("llama", tmp_path / "model")
    workload = step_split.Workload([list(range(5, 45))], max_tokens=3)
    wall, split = step_split.run(model, "fp32", workload, False, True)
    assert split.calls["prefix-cache hashing"] == 3
    assert 0 < split.seconds["prefix-cache hashing"] < split.seconds["step"] <= wall
