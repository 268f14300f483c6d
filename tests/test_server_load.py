"""Many concurrent streams against a real server: cancellations, metrics, the queue limit."""

import asyncio
import json
import time

import openai
import pytest

from kvserve import LLM, SamplingParams

from server_process import API_KEY, ServerProcess, sample

PROMPTS = ["def f(x):", "import os\n", "class A:\n    ", "# a comment about"]
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    return checkpoint("llama")


def _client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


async def _stream(client, prompt: str, cancel_after: int | None) -> str | None:
    """A stream's text, or None if it was cancelled after ``cancel_after`` chunks (those
    ask for many tokens, so that they cannot end before the server sees them go)."""
    stream = await client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=MAX_TOKENS if cancel_after is None else 400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    text, chunks = "", 0
    async for chunk in stream:
        text += chunk.choices[0].text
        chunks += 1
        if cancel_after is not None and chunks == cancel_after:
            await stream.close()
            return None
    return text


async def _watch(server: ServerProcess, seen: dict[str, list[float]], done: asyncio.Event):
    """Samples every watched metric from one scrape at a time, until ``done``."""
    while not done.is_set():
        exposition = await asyncio.to_thread(server.get, "/metrics")
        for name in seen:
            seen[name].append(sample(exposition, name))
        await asyncio.sleep(0.005)


def _settle(server: ServerProcess) -> None:
    """Waits (30 s at most) for the server to apply the last disconnects: a client that closed
    its stream has returned before the server noticed and aborted its request."""
    deadline = time.monotonic() + 30
    while server.metric("vllm:num_requests_running") + server.metric("vllm:num_requests_waiting"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_64_streams_with_a_third_cancelled(model_dir, tmp_path):
    expected = {
        p: o.outputs[0].text
        for p, o in zip(
            PROMPTS,
            LLM(str(model_dir), num_kv_blocks=256).generate(
                PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
            ),
            strict=True,
        )
    }
    args = ("--num-kv-blocks", "256", "--max-num-seqs", "8")
    with ServerProcess(model_dir, *args, log=tmp_path / "server.log") as server:
        names = ["vllm:num_requests_waiting", "vllm:num_requests_running"]
        names.append("vllm:kv_cache_usage_perc")
        seen: dict[str, list[float]] = {name: [] for name in names}

        async def run() -> list[str | None]:
            async with _client(server) as client:
                done = asyncio.Event()
                watcher = asyncio.create_task(_watch(server, seen, done))
                results = await asyncio.gather(
                    *[
                        _stream(client, PROMPTS[i % 4], cancel_after=3 if i % 3 == 0 else None)
                        for i in range(64)
                    ]
                )
                done.set()
                await watcher
                return results

        results = asyncio.run(run())
        cancelled = [i for i in range(64) if i % 3 == 0]
        for i, text in enumerate(results):
            assert text == (None if i in cancelled else expected[PROMPTS[i % 4]])
        assert max(seen["vllm:num_requests_waiting"]) > 0
        assert max(seen["vllm:num_requests_running"]) == 8
        assert all(0 <= u <= 1 for u in seen["vllm:kv_cache_usage_perc"])
        assert max(seen["vllm:kv_cache_usage_perc"]) > 0
        _settle(server)
        assert server.metric("vllm:kv_cache_usage_perc") == 0
        assert server.metric("vllm:request_success_total", finished_reason="abort") == len(
            cancelled
        )
        assert server.metric("vllm:request_success_total", finished_reason="length") == 64 - len(
            cancelled
        )
        finished = 64 - len(cancelled)
        assert server.metric("vllm:generation_tokens_total") >= finished * MAX_TOKENS
        assert server.metric("vllm:e2e_request_latency_seconds_count") == finished


def test_a_full_waiting_queue_answers_503(model_dir, tmp_path):
    args = ("--num-kv-blocks", "64", "--max-num-seqs", "1", "--max-waiting-requests", "2")
    with ServerProcess(model_dir, *args, log=tmp_path / "server.log") as server:

        async def run() -> list:
            async with _client(server) as client:
                return await asyncio.gather(
                    *[
                        client.completions.create(
                            model="tiny",
                            prompt=PROMPTS[0],
                            max_tokens=40,
                            temperature=0,
                            extra_body={"ignore_eos": True},
                        )
                        for _ in range(8)
                    ],
                    return_exceptions=True,
                )

        results = asyncio.run(run())
        refused = [r for r in results if isinstance(r, openai.InternalServerError)]
        assert refused, results
        assert all(r.status_code == 503 for r in refused)
        assert all(r.choices[0].finish_reason == "length" for r in results if r not in refused)
        assert server.metric("kvserve:requests_rejected_total") == len(refused)


OVERLOADED = {
    "error": {
        "message": "the server is at capacity (2 requests waiting); retry later",
        "type": "service_unavailable_error",
        "param": None,
        "code": "server_overloaded",
    }
}


def test_admission_counts_engine_requests_exactly(model_dir, tmp_path):
    """4 run and 2 wait: of 8 requests sent at once exactly 6 are admitted and 2 are told to
    retry; one that needs more sequences than the batch and the queue hold is a 400."""
    args = ("--num-kv-blocks", "256", "--max-num-seqs", "4", "--max-waiting-requests", "2")
    with ServerProcess(model_dir, *args, log=tmp_path / "server.log") as server:
        body = {"prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True}

        async def burst() -> list:
            async with _client(server) as client:
                extra = {"ignore_eos": True}
                return await asyncio.gather(
                    *[
                        client.completions.with_raw_response.create(
                            model="tiny", prompt=PROMPTS[0], max_tokens=400, extra_body=extra
                        )
                        for _ in range(8)
                    ],
                    return_exceptions=True,
                )

        results = asyncio.run(burst())
        refused = [r for r in results if isinstance(r, openai.APIStatusError)]
        statuses = [(r.status_code, r.response.headers["Retry-After"]) for r in refused]
        assert statuses == [(503, "1")] * 2
        assert all(r.response.json() == OVERLOADED for r in refused)
        admitted = [r.parse() for r in results if r not in refused]
        assert [c.choices[0].finish_reason for c in admitted] == ["length"] * 6
        assert server.metric("kvserve:requests_rejected_total") == 2
        for fields, param in ((dict(n=7), "n"), (dict(prompt=[PROMPTS[0]] * 7), "prompt")):
            status, _, answer = server.send(
                "/v1/completions",
                json.dumps(body | fields).encode(),
                {"Content-Type": "application/json"},
            )
            assert (status, json.loads(answer)) == (
                400,
                {
                    "error": {
                        "message": "this request needs 7 sequences but the server runs 4 and "
                        "queues 2; send fewer prompts or a smaller 'n'",
                        "type": "invalid_request_error",
                        "param": param,
                        "code": None,
                    }
                },
            )
        assert server.metric("vllm:num_requests_waiting") == 0
