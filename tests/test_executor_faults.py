"""A tensor-parallel worker that dies, raises or stops answering turns the engine dead at
once (the step's requests fail, ``EngineDeadError`` names the rank), and shutdown leaves no
worker process behind."""

import dataclasses
import os
import signal
import time

import pytest

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.executor import messages, multiproc
from kvserve.engine.llm_engine import EngineDeadError, LLMEngine

from faults import gone

GREEDY = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)


@pytest.fixture
def engine(checkpoint):
    engine = LLMEngine(
        EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=32, tensor_parallel_size=2)
    )
    engine.add_request("a", "def f(x):", GREEDY)
    engine.step()
    yield engine
    engine.shutdown()
    assert all(gone(pid) for pid in engine.runner.pids)


def step_until_dead(engine: LLMEngine, within: float) -> EngineDeadError:
    start = time.monotonic()
    with pytest.raises(EngineDeadError) as info:
        while time.monotonic() - start < within:
            engine.step()
    assert time.monotonic() - start < within
    assert engine.requests == {}
    assert engine.kv.pool.num_free_blocks == 32
    return info.value


def test_a_killed_worker_kills_the_engine_at_once(engine):
    (pid,) = engine.runner.pids
    os.kill(pid, signal.SIGKILL)
    error = step_until_dead(engine, within=5)
    assert f"rank 1 (pid {pid}) exited with signal SIGKILL" in str(error)
    with pytest.raises(EngineDeadError):
        engine.check_health()


def test_a_worker_killed_between_steps_shows_in_the_health_check(engine):
    (pid,) = engine.runner.pids
    engine.abort_request("a")
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if engine.runner.workers[0].process.exitcode is not None:
            break
        time.sleep(0.05)
    with pytest.raises(EngineDeadError, match="exited with signal SIGKILL"):
        engine.check_health()


def test_a_worker_that_raises_in_its_step_kills_the_engine(engine):
    out = engine.scheduler.schedule()
    inputs = engine.runner.runner.prepare(out)
    broken = dataclasses.replace(inputs, input_ids=inputs.input_ids.float())
    messages.send(
        engine.runner.workers[0].sock, messages.Step.of(broken)
    )  # the embedding lookup raises
    engine.runner.workers[0].process.join(10)
    engine.scheduler.abort(engine.requests.pop("a"))
    engine.add_request("b", "pass", GREEDY)
    error = step_until_dead(engine, within=5)
    assert "tensor-parallel rank 1 failed: RuntimeError" in str(error), error


def test_a_worker_that_stops_answering_fails_the_step_at_the_timeout(checkpoint, monkeypatch):
    monkeypatch.setattr(multiproc, "STEP_TIMEOUT_S", 3.0)
    engine = LLMEngine(
        EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=32, tensor_parallel_size=2)
    )
    (pid,) = engine.runner.pids
    try:
        engine.add_request("a", "def f(x):", GREEDY)
        engine.step()
        os.kill(pid, signal.SIGSTOP)
        error = step_until_dead(engine, within=10)
        assert "rank" in str(error)
    finally:
        engine.shutdown()
    assert gone(pid)
