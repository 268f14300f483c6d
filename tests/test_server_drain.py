"""SIGTERM: readiness drops at once, new requests get 503, active streams finish, exit 0."""

import asyncio
import signal
import time

import openai

from server_process import API_KEY, ServerProcess


def test_sigterm_drains_16_streams_then_exits_0(checkpoint, tmp_path):
    server = ServerProcess(
        checkpoint("llama"),
        "--num-kv-blocks", "256", "--max-num-seqs", "16", "--shutdown-timeout", "60",
        log=tmp_path / "server.log",
    )  # fmt: skip
    with server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
        process = server.process
        assert process is not None

        async def stream(started: asyncio.Queue) -> tuple[int, str]:
            response = await client.completions.create(
                model="tiny",
                prompt="def f(x):",
                max_tokens=400,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            pieces, reason = [], None
            async for chunk in response:
                if not pieces:
                    started.put_nowait(None)
                pieces.append(chunk.choices[0].text)
                reason = chunk.choices[0].finish_reason
            return len(pieces), reason

        async def run():
            started: asyncio.Queue = asyncio.Queue()
            tasks = [asyncio.create_task(stream(started)) for _ in range(16)]
            for _ in range(16):
                await started.get()
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            ready = await asyncio.to_thread(server.status, "/ready")
            try:
                await client.completions.create(model="tiny", prompt="x", max_tokens=2)
                late = None
            except openai.APIStatusError as exc:
                late = exc.status_code
            return await asyncio.gather(*tasks), ready, late

        begin = time.monotonic()
        results, ready, late = asyncio.run(run())
        assert ready == 503
        assert late == 503
        assert [reason for _, reason in results] == ["length"] * 16
        assert process.wait(60) == 0
        assert time.monotonic() - begin < 60
