"""The server around a real engine whose steps are made to fail: a request cannot take the
engine down, a failed step fails only its own requests (an error event, then ``[DONE]``),
and an engine that cannot go on turns ``/ready`` and ``/health`` 503 at once."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.server.app import build_app
from kvserve.server.drain import DrainState
from kvserve.server.metrics import ServerMetrics
from kvserve.server.state import ServerState

from faults import fail_on

NUM_BLOCKS = 128
FAILED = {
    "error": {
        "message": "the engine failed while generating this request",
        "type": "internal_server_error",
        "param": None,
        "code": "engine_error",
    }
}
DEAD = {
    "error": {
        "message": "the engine stopped and this server can serve no request",
        "type": "service_unavailable_error",
        "param": None,
        "code": "engine_dead",
    }
}


def new_engine(checkpoint) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=NUM_BLOCKS))


@pytest.fixture(scope="module")
def engine(checkpoint):
    return new_engine(checkpoint)


@dataclass
class Served:
    state: ServerState
    session: aiohttp.ClientSession

    @property
    def engine(self) -> LLMEngine:
        return self.state.llm.engine

    def metric(self, name: str, **labels: str) -> float | None:
        return self.state.metrics.registry.get_sample_value(name, {"model_name": "tiny", **labels})

    async def status(self, path: str) -> tuple[int, dict]:
        async with self.session.get(path) as response:
            return response.status, await response.json()

    async def post(self, body: dict) -> tuple[int, dict]:
        async with self.session.post("/v1/completions", data=json.dumps(body)) as response:
            return response.status, await response.json()

    @contextlib.asynccontextmanager
    async def stream(self, body: dict) -> AsyncIterator["Events"]:
        data = json.dumps(body | {"stream": True})
        async with self.session.post("/v1/completions", data=data) as response:
            assert response.status == 200
            yield Events(response)


@dataclass
class Events:
    response: aiohttp.ClientResponse

    async def next(self) -> dict | str:
        event = (await self.response.content.readuntil(b"\n\n")).decode()
        assert (event[:6], event[-2:]) == ("data: ", "\n\n"), event
        data = event[len("data: ") : -2]
        return data if data == "[DONE]" else json.loads(data)

    async def rest(self) -> list[dict | str]:
        events = []
        while not self.response.content.at_eof():
            events.append(await self.next())
            if events[-1] == "[DONE]":
                assert await self.response.content.read() == b""
        return events


@contextlib.asynccontextmanager
async def serving(engine: LLMEngine) -> AsyncIterator[Served]:
    """The app on a loopback port around ``engine``, with its own step thread."""
    metrics = ServerMetrics("tiny")
    llm = AsyncLLM(engine, metrics)
    llm.start()
    drain = DrainState()
    drain.loaded = True
    state = ServerState(
        llm=llm, model_name="tiny", model_path=engine.config.model, metrics=metrics, drain=drain
    )
    server = TestServer(build_app(state), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url(""))) as session:
            yield Served(state, session)
    finally:
        await server.close()
        llm.shutdown()


async def wait_for(condition, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def assert_idle(served: Served) -> None:
    """Nothing running or waiting, no block held, and /metrics says so."""
    engine = served.engine
    await wait_for(
        lambda: not engine.has_unfinished_requests() and served.state.llm.num_unfinished == 0
    )
    assert engine.kv.pool.num_free_blocks == NUM_BLOCKS
    stats = (engine.stats.num_running, engine.stats.num_waiting, engine.kv.usage)
    assert stats == (0, 0, 0.0)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert served.metric(name) == 0


def greedy(prompt: str, max_tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def test_the_reported_top_k_is_a_400_and_the_engine_serves_on(engine):
    huge = 9223372036854775808
    error = {
        "error": {
            "message": f"invalid top_k: {huge} (must be in [-1, 2147483647])",
            "type": "invalid_request_error",
            "param": "top_k",
            "code": None,
        }
    }

    async def main():
        async with serving(engine) as served:
            assert await served.post({"prompt": "hi", "top_k": huge, "top_p": 0.5}) == (400, error)
            greedy_huge = {"prompt": "hi", "top_k": huge, "temperature": 0}
            assert await served.post(greedy_huge) == (400, error)
            assert (await served.post({"prompt": "hi", "seed": 2**64}))[1]["error"][
                "param"
            ] == "seed"
            # The largest top_k accepted, greedy, batched with another request's top_p < 1.
            results = await asyncio.gather(
                served.post(greedy("hi", 8) | {"top_k": 2**31 - 1}),
                served.post({"prompt": "hi", "max_tokens": 8, "top_p": 0.5, "ignore_eos": True}),
            )
            assert [status for status, _ in results] == [200, 200]
            assert [body["usage"]["completion_tokens"] for _, body in results] == [8, 8]
            assert await served.status("/ready") == (200, {"status": "ready"})
            assert await served.status("/health") == (200, {"status": "ok"})
            await assert_idle(served)

    asyncio.run(main())


def test_a_sampling_failure_fails_only_its_own_stream(engine, monkeypatch):
    async def main():
        async with serving(engine) as served:
            expected = (await served.post(greedy("def f(x):", 20)))[1]["choices"][0]["text"]
            failures = engine.stats.num_failed_steps  # the engine's count, since it started
            fail_on(
                monkeypatch,
                engine,
                "sampler",
                lambda _, rs: any(r.params.max_tokens == 7 for r in rs),
            )

            async def collect(body: dict) -> list:
                async with served.stream(body) as events:
                    return await events.rest()

            a, b, c = await asyncio.gather(
                collect(greedy("def f(x):", 20)),
                collect(greedy("pass", 7)),
                collect(greedy("def f(x):", 20)),
            )
            assert b == [FAILED, "[DONE]"]
            for events in (a, c):
                assert events[-1] == "[DONE]"
                assert "".join(e["choices"][0]["text"] for e in events[:-1]) == expected
                assert events[-2]["choices"][0]["finish_reason"] == "length"
            assert served.metric("kvserve:engine_step_failures_total") == failures + 1
            assert served.metric("vllm:request_success_total", finished_reason="error") == 1
            assert served.metric("vllm:request_success_total", finished_reason="length") == 3
            assert await served.status("/ready") == (200, {"status": "ready"})
            await assert_idle(served)

    asyncio.run(main())


def test_a_failed_step_fails_its_requests_and_the_next_request_succeeds(engine, monkeypatch):
    async def main():
        async with serving(engine) as served:
            failures = engine.stats.num_failed_steps
            async with (
                served.stream(greedy("def f(x):", 200)) as one,
                served.stream(greedy("pass", 200)) as two,
            ):
                firsts = [await one.next(), await two.next()]
                whole = asyncio.create_task(served.post(greedy("import os", 200)))
                await wait_for(lambda: served.engine.stats.num_running == 3)
                failed = fail_on(monkeypatch, engine.runner, "execute", lambda *_: not failed)
                one_rest, two_rest = await one.rest(), await two.rest()
            assert [f["choices"][0]["finish_reason"] for f in firsts] == [None, None]
            assert one_rest[-2:] == two_rest[-2:] == [FAILED, "[DONE]"]
            assert all("choices" in e for e in one_rest[:-2] + two_rest[:-2])
            assert await whole == (500, FAILED)
            assert served.metric("kvserve:engine_step_failures_total") == failures + 1
            assert served.metric("vllm:request_success_total", finished_reason="error") == 3
            assert await served.status("/ready") == (200, {"status": "ready"})
            assert await served.status("/health") == (200, {"status": "ok"})
            status, body = await served.post(greedy("def f(x):", 5))
            assert (status, body["choices"][0]["finish_reason"]) == (200, "length")
            await assert_idle(served)

    asyncio.run(main())


def test_a_dead_engine_turns_ready_and_health_503_and_ends_every_stream(checkpoint, monkeypatch):
    engine = new_engine(checkpoint)

    async def main():
        async with serving(engine) as served:
            async with (
                served.stream(greedy("def f(x):", 200)) as one,
                served.stream(greedy("pass", 200)) as two,
            ):
                await one.next(), await two.next()
                fail_on(monkeypatch, engine.scheduler, "schedule", lambda *_: True)
                one_rest, two_rest = await one.rest(), await two.rest()
            assert one_rest[-2:] == two_rest[-2:] == [DEAD, "[DONE]"]
            assert await served.status("/ready") == (503, {"status": "engine dead"})
            assert await served.status("/health") == (503, {"status": "engine not making progress"})
            async with served.session.post(
                "/v1/completions", data=json.dumps(greedy("x", 2))
            ) as late:
                assert (late.status, await late.json()) == (503, DEAD)
                assert late.headers["Retry-After"] == "1"
            assert served.metric("vllm:num_requests_running") == 0
            assert served.metric("vllm:num_requests_waiting") == 0
            assert served.metric("vllm:request_success_total", finished_reason="error") == 2
            async with served.session.get("/metrics") as response:
                assert 'vllm:num_requests_running{model_name="tiny"} 0.0' in await response.text()

    asyncio.run(main())


def test_failed_forwards_in_a_row_kill_the_engine_and_ready_follows(checkpoint, monkeypatch):
    engine = new_engine(checkpoint)

    async def main():
        async with serving(engine) as served:
            fail_on(monkeypatch, engine.runner, "execute", lambda *_: True)
            assert await served.post(greedy("a", 2)) == (500, FAILED)
            assert await served.post(greedy("b", 2)) == (500, FAILED)
            assert await served.status("/ready") == (200, {"status": "ready"})
            assert await served.post(greedy("c", 2)) == (503, DEAD)
            assert await served.status("/ready") == (503, {"status": "engine dead"})
            assert served.metric("kvserve:engine_step_failures_total") == 3
            assert served.metric("vllm:request_success_total", finished_reason="error") == 3

    asyncio.run(main())
