"""The engine thread's commands: adds, aborts (known or not) and a shutdown with requests
still open, each a small type applied in order."""

import asyncio

import pytest

from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import EngineDeadError, LLMEngine
from kvserve.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("scheduling")

SHORT = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


class Aborts:
    """Records what the engine thread tells an observer about aborts and deaths."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.dead: list[int] = []

    def on_step(self, stats, outputs) -> None:
        pass

    def on_abort(self, request_id: str, stats, num_aborted: int) -> None:
        self.aborted.append(request_id)

    def on_engine_dead(self, stats, num_failed: int) -> None:
        self.dead.append(num_failed)


@pytest.fixture
def engine(checkpoint):
    return LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))


def test_aborting_an_unknown_id_changes_nothing(engine):
    observer = Aborts()

    async def main():
        llm = AsyncLLM(engine, observer)
        llm.start()
        try:
            stream = await llm.add_request("a", "def f(x):", SHORT)
            llm.abort("no-such-request")
            return [out async for out in stream]
        finally:
            llm.shutdown()

    outputs = asyncio.run(main())
    assert [o.outputs[0].num_output_tokens for o in outputs] == [1, 2, 3, 4, 5, 6]
    assert (outputs[-1].finished, outputs[-1].outputs[0].finish_reason) == (True, "length")
    assert observer.aborted == []
    assert (engine.has_unfinished_requests(), engine.requests) == (False, {})


def test_shutdown_fails_every_open_and_queued_request_and_frees_their_blocks(engine):
    observer = Aborts()

    async def collect(llm: AsyncLLM, request_id: str):
        return [out async for out in llm.generate("import os", LONG, request_id)]

    async def main():
        llm = AsyncLLM(engine, observer)
        llm.start()
        tasks = [asyncio.ensure_future(collect(llm, f"q{i}")) for i in range(3)]
        await asyncio.sleep(0)  # each task has queued its add and waits for the engine
        llm.shutdown()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        with pytest.raises(EngineDeadError, match=r"^the engine shut down$"):
            await llm.add_request("late", "import os", LONG)
        return results

    results = asyncio.run(main())
    assert [(type(r), str(r)) for r in results] == [(EngineDeadError, "the engine shut down")] * 3
    assert observer.aborted == ["q0", "q1", "q2"]
    assert observer.dead == []
    assert (engine.has_unfinished_requests(), engine.requests) == (False, {})
    assert engine.kv.pool.num_free_blocks == 64
