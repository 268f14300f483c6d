"""One device → host copy per step: the sampled tokens with their log-probabilities and the
prompt log-probabilities, packed, whatever the batch mixes (greedy, seeded top-k/top-p/min-p,
penalties, logit bias, ``min_tokens``, a grammar), with async scheduling off and on. Every
copy the engine makes goes through ``host_copy.to_host``, which counts them."""

import itertools
import json

import pytest

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.host_copy import HostCopies
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.structured.spec import OutputConstraint

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
BATCH = {
    "greedy": SamplingParams(
        temperature=0, max_tokens=10, ignore_eos=True, logprobs=2, prompt_logprobs=3
    ),
    "sampled": SamplingParams(
        temperature=0.9,
        top_k=20,
        top_p=0.8,
        min_p=0.05,
        seed=1,
        max_tokens=12,
        logprobs=3,
        ignore_eos=True,
    ),
    "penalised": SamplingParams(
        temperature=0,
        max_tokens=8,
        repetition_penalty=1.2,
        frequency_penalty=0.3,
        presence_penalty=0.2,
        logit_bias={7: 2.0},
        min_tokens=4,
    ),
    "json": SamplingParams(max_tokens=30, constraint=OutputConstraint("json", json.dumps(SCHEMA))),
}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_step_copies_to_the_host_once(checkpoint, async_scheduling):
    engine = LLMEngine(
        EngineConfig(
            model=str(checkpoint("llama")), num_kv_blocks=64, async_scheduling=async_scheduling
        )
    )
    engine.grammars.compile(BATCH["json"].constraint)
    at_each_run: list[int] = []
    run = engine.runner.run

    def counted(inputs):
        at_each_run.append(HostCopies.count)
        return run(inputs)

    engine.runner.run = counted
    for request_id, params in BATCH.items():
        engine.add_request(request_id, "def f(x):", params)
    finished = set()
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
    at_each_run.append(HostCopies.count)
    assert finished == set(BATCH)
    copies = [b - a for a, b in itertools.pairwise(at_each_run)]
    assert len(copies) >= 12 and set(copies) == {1}


def test_an_async_step_with_penalties_copies_once_and_does_not_sync_the_step(checkpoint):
    """Penalties and ``min_tokens`` read the history on the device: every step but the first
    is submitted while the one before it is still in flight (not yet processed)."""
    engine = LLMEngine(
        EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64, async_scheduling=True)
    )
    assert engine._async is not None
    copies_at_run: list[int] = []
    overlapped: list[bool] = []
    run, submit = engine.runner.run, engine._async._submit

    def counted(inputs):
        copies_at_run.append(HostCopies.count)
        return run(inputs)

    def submitted(out, previous):
        overlapped.append(previous is not None)
        submit(out, previous)

    engine.runner.run = counted
    engine._async._submit = submitted  # type: ignore[method-assign]
    engine.add_request("penalised", "def f(x):", BATCH["penalised"])
    engine.add_request(
        "min_tokens", "import os", SamplingParams(temperature=0, max_tokens=11, min_tokens=9)
    )
    while engine.has_unfinished_requests():
        engine.step()
    copies_at_run.append(HostCopies.count)
    copies = [b - a for a, b in itertools.pairwise(copies_at_run)]
    assert len(copies) >= 10 and set(copies) == {1}
    assert overlapped == [False] + [True] * (len(overlapped) - 1)
