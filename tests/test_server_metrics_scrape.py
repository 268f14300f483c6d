"""``/metrics`` answers from its snapshot while the engine is inside a long step."""

import asyncio
import time

from test_server_faults import greedy, new_engine, serving

from faults import slow_down

STEP_SECONDS = 2.0
# A scrape that waited for the step would take most of STEP_SECONDS.
SCRAPE_BOUND_SECONDS = 0.5


def test_metrics_answer_while_a_step_spins_holding_the_gil(checkpoint, monkeypatch):
    engine = new_engine(checkpoint)

    async def main():
        async with serving(engine) as served:
            in_step = slow_down(monkeypatch, engine.runner, "execute", STEP_SECONDS)
            async with served.stream(greedy("def f(x):", 2)) as stream:
                while not in_step.is_set():
                    await asyncio.sleep(0.005)
                latencies = []
                for _ in range(5):
                    start = time.monotonic()
                    async with served.session.get("/metrics") as response:
                        body = await response.text()
                    latencies.append(time.monotonic() - start)
                    assert response.status == 200
                    assert 'vllm:num_requests_waiting_by_reason{model_name="tiny",' in body
                assert in_step.is_set(), "the step ended before the scrapes: no proof"
                assert max(latencies) < SCRAPE_BOUND_SECONDS, latencies
                await stream.rest()

    asyncio.run(main())
