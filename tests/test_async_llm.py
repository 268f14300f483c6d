"""The async engine: streams per request, aborts that free blocks, an idle loop that sleeps."""

import asyncio
import time

import pytest
from joined_outputs import JoinedOutputs

from kvserve.engine import async_llm
from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.config import EngineConfig
from kvserve.engine.engine_builder import build_engine
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("scheduling")

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(checkpoint, scheduling):
    return LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))


def _run(engine: LLMEngine, body, observer=None):
    async def main():
        llm = AsyncLLM(engine, observer)
        llm.start()
        try:
            return await body(llm)
        finally:
            llm.shutdown()

    return asyncio.run(main())


def test_generate_streams_one_output_per_token_and_matches_step_by_step(engine):
    async def body(llm: AsyncLLM):
        return [out async for out in llm.generate("def f(x):", GREEDY, "a")]

    seen = JoinedOutputs()
    outputs = [seen.add([o])[0] for o in _run(engine, body)]
    assert [len(o.outputs[0].token_ids) for o in outputs] == list(range(1, 13))
    assert [o.finished for o in outputs] == [False] * 11 + [True]
    engine.add_request("b", "def f(x):", GREEDY)
    stepped = JoinedOutputs()
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in stepped.add(engine.step()) if o.finished]
    (final,) = finals
    assert outputs[-1].outputs[0].token_ids == final.outputs[0].token_ids
    assert outputs[-1].outputs[0].text == final.outputs[0].text


def test_leaving_a_stream_aborts_the_request_and_frees_its_blocks(engine):
    async def body(llm: AsyncLLM):
        long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        stream = await llm.add_request("c", "import os", long)
        async for out in stream:
            if out.outputs[0].num_output_tokens == 3:
                break
        await stream.aclose()
        for _ in range(100):
            if llm.num_unfinished == 0 and not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        return llm.num_unfinished, engine.stats.num_running, engine.kv.usage

    assert _run(engine, body) == (0, 0, 0.0)


def test_a_refused_request_raises_at_once(engine):
    async def body(llm: AsyncLLM):
        with pytest.raises(ValueError, match="leaves no room"):
            await llm.add_request("d", [5] * 600, GREEDY)
        return llm.num_unfinished

    assert _run(engine, body) == 0


def test_the_loop_sleeps_when_idle(engine, monkeypatch):
    calls = []
    original = engine.has_unfinished_requests
    monkeypatch.setattr(
        engine, "has_unfinished_requests", lambda: calls.append(time.monotonic()) or original()
    )

    async def body(llm: AsyncLLM):
        async for _ in llm.generate("x", GREEDY, "e"):
            pass
        await asyncio.sleep(0.05)
        before = len(calls)
        await asyncio.sleep(0.3)
        return before, len(calls), llm.is_alive

    before, after, alive = _run(engine, body)
    assert after == before
    assert alive


def test_concurrent_requests_each_get_their_own_stream(engine):
    async def body(llm: AsyncLLM):
        async def collect(request_id: str, prompt: str):
            return [o.request_id async for o in llm.generate(prompt, GREEDY, request_id)]

        return await asyncio.gather(*[collect(f"r{i}", "ab" * (i + 1)) for i in range(5)])

    for i, ids in enumerate(_run(engine, body)):
        assert ids == [f"r{i}"] * 12


class HandoffCountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the callbacks other threads hand it."""

    def __init__(self) -> None:
        super().__init__()
        self.handoffs = 0

    def call_soon_threadsafe(self, callback, *args, context=None):
        self.handoffs += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


class StepsWithOutputs:
    def __init__(self) -> None:
        self.steps = self.outputs = 0

    def on_step(self, stats, outputs) -> None:
        if outputs:
            self.steps += 1
            self.outputs += len(outputs)

    def on_abort(self, request_id: str, stats, num_aborted: int) -> None:
        pass

    def on_engine_dead(self, stats, num_failed: int) -> None:
        pass


def test_each_steps_outputs_reach_the_event_loop_in_one_handoff(engine):
    """One wake-up of the event loop per step (plus one per accepted add), however many
    requests the step ran."""
    observer = StepsWithOutputs()
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main():
        llm = AsyncLLM(engine, observer)
        llm.start()
        try:
            streams = [await llm.add_request(f"r{i}", "def f(x):", params) for i in range(4)]
            return [[out async for out in stream] for stream in streams]
        finally:
            llm.shutdown()

    with asyncio.Runner(loop_factory=HandoffCountingLoop) as runner:
        results = runner.run(main())
        handoffs = runner.get_loop().handoffs
    assert [len(outputs) for outputs in results] == [5, 5, 5, 5]
    assert observer.outputs == 20 > observer.steps
    assert handoffs == 4 + observer.steps


class StepRequests(StepsWithOutputs):
    """The ids of each step's outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[set[str]] = []

    def on_step(self, stats, outputs) -> None:
        if outputs:
            self.ids.append({o.request_id for o in outputs})


def _first_step_of_adds_sent_at(engine, offsets: list[float]) -> set[str]:
    """Adds sent `offsets` seconds after the first to an idle engine: who ran in step one."""
    observer = StepRequests()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    async def body(llm: AsyncLLM):
        async def collect(request_id: str, offset: float):
            await asyncio.sleep(offset)
            return [o async for o in llm.generate("def f(x):", params, request_id)]

        await asyncio.gather(*[collect(f"r{i}", t) for i, t in enumerate(offsets)])

    _run(engine, body, observer)
    return observer.ids[0]


def test_requests_sent_together_to_an_idle_engine_start_in_one_step(engine, monkeypatch):
    """Woken by one add, the loop waits out a quiet spell before it steps: the adds that
    follow within it run in the first step too (scaled up here: 0.5 s of quiet)."""
    monkeypatch.setattr(async_llm, "ARRIVAL_QUIET_S", 0.5)
    monkeypatch.setattr(async_llm, "ARRIVAL_WINDOW_S", 5.0)
    assert _first_step_of_adds_sent_at(engine, [0.0, 0.1, 0.2]) == {"r0", "r1", "r2"}


def test_the_wait_for_more_requests_ends_at_its_window(engine, monkeypatch):
    """However the adds keep coming, the first step starts `ARRIVAL_WINDOW_S` after the add
    that woke the loop."""
    monkeypatch.setattr(async_llm, "ARRIVAL_QUIET_S", 0.5)
    monkeypatch.setattr(async_llm, "ARRIVAL_WINDOW_S", 0.3)
    assert _first_step_of_adds_sent_at(engine, [0.0, 0.1, 0.45]) == {"r0", "r1"}


def test_build_engine_raises_what_building_the_engine_raised(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^no config\.json in model directory "):
        build_engine(EngineConfig(model=str(tmp_path)))
