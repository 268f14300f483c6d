"""SIGTERM: readiness drops at once, new requests get 503, active streams finish, exit 0;
the shutdown timeout's cut ends even a stream that would never end."""

import asyncio
import concurrent.futures
import json
import signal
import socket
import time
import urllib.request

import openai

from kvserve.server.drain import DrainState

from server_process import API_KEY, ServerProcess

JSON = {"Content-Type": "application/json"}


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
                late = (exc.status_code, exc.response.headers.get("Retry-After"))
            return await asyncio.gather(*tasks), ready, late

        begin = time.monotonic()
        results, ready, late = asyncio.run(run())
        assert ready == 503
        assert late == (503, "1")
        assert [reason for _, reason in results] == ["length"] * 16
        assert process.wait(60) == 0
        assert time.monotonic() - begin < 60


def _stream_events(response) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, read to its end."""
    return [
        line[6:].rstrip("\n") for line in map(bytes.decode, response) if line.startswith("data: ")
    ]


def test_the_shutdown_timeout_cuts_streams_cleanly_and_exits_in_time(checkpoint, tmp_path):
    """At the deadline every stream still running ends with a last event and [DONE]; a
    stalled upload and a half-sent request line do not hold the exit back."""
    server = ServerProcess(
        checkpoint("llama"),
        "--num-kv-blocks", "256", "--max-num-seqs", "1", "--shutdown-timeout", "1",
        log=tmp_path / "server.log",
    )  # fmt: skip
    body = {"prompt": "def f(x):", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with server:
        process = server.process
        assert process is not None
        stalled = socket.create_connection(("127.0.0.1", server.port))
        stalled.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"prompt": '
        )
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"POST /v1/compl")
        whole = dict(body, stream=False, n=8)  # 8 × 400 tokens, one at a time: seconds
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(server.send, "/v1/completions", json.dumps(whole).encode(), JSON)
            deadline = time.monotonic() + 30
            while server.metric("vllm:num_requests_running") == 0:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            streams = [_open_stream(server, body) for _ in range(16)]
            begin = time.monotonic()
            process.send_signal(signal.SIGTERM)
            events = [_stream_events(stream) for stream in streams]
            status, headers, answer = pending.result(30)
        assert process.wait(30) == 0
        elapsed = time.monotonic() - begin
        assert (stalled.recv(1), half.recv(1)) == (b"", b"")  # closed, no answer
    # One sequence at a time: 8 × 400 tokens queued before the streams take seconds. A fast
    # CPU may still finish a stream or two in the second before the deadline; the rest are cut.
    cut = {"index": 0, "text": "", "logprobs": None, "finish_reason": "abort", "stop_reason": None}
    assert [stream[-1] for stream in events] == ["[DONE]"] * 16
    last = [json.loads(stream[-2])["choices"] for stream in events]
    assert all(c == [cut] or c[0]["finish_reason"] == "length" for c in last), last
    assert last.count([cut]) >= 12
    assert (status, headers["Retry-After"], json.loads(answer)) == (
        503,
        "1",
        {
            "error": {
                "message": "the server shut down before this request finished; retry it",
                "type": "service_unavailable_error",
                "param": None,
                "code": None,
            }
        },
    )
    assert elapsed < 1 + 2 + 8  # the timeout, the cut's grace, the interpreter's exit


def _open_stream(server: ServerProcess, body: dict):
    request = urllib.request.Request(
        server.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    return urllib.request.urlopen(request, timeout=60)


def test_slow_headers_and_a_stalled_body_time_out(checkpoint, tmp_path):
    server = ServerProcess(
        checkpoint("llama"),
        "--num-kv-blocks", "64", "--timeout-keep-alive", "1", "--request-body-timeout", "1",
        log=tmp_path / "server.log",
    )  # fmt: skip
    with server:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        begin = time.monotonic()
        assert slow.recv(1) == b""  # closed by the server, headers never finished
        assert time.monotonic() - begin < 10
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        stalled.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {API_KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"prompt": '
        )
        answer = stalled.makefile("rb")
        assert answer.readline() == b"HTTP/1.1 408 Request Timeout\r\n"
        headers = dict(line.decode().split(": ", 1) for line in iter(answer.readline, b"\r\n"))
        assert json.loads(answer.read(int(headers["Content-Length"]))) == {
            "error": {
                "message": "the request body did not arrive within 1 s",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        assert server.metric("vllm:num_requests_running") == 0


def test_until_cut_ends_an_endless_stream_and_closes_it():
    closed = []

    async def endless():
        try:
            yield 1
            await asyncio.Event().wait()
        finally:
            closed.append(True)

    async def run() -> list[int]:
        drain = DrainState()
        got = []
        async for item in drain.until_cut(endless()):
            got.append(item)
            asyncio.get_running_loop().call_later(0.05, drain.cut)
        return got

    assert asyncio.run(run()) == [1]
    assert closed == [True]
