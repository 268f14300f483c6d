"""A ``kvserve serve`` process with two tensor-parallel ranks answers completions; when its
worker is killed mid-stream the stream gets an error event and ``[DONE]``, /health turns
503, and the server exits non-zero (so the kubelet restarts it) leaving no worker behind."""

import json
import os
import signal
import socket
import urllib.request
from pathlib import Path

from faults import gone
from server_process import API_KEY, ServerProcess

DEAD_EVENT = {
    "error": {
        "message": "the engine stopped and this server can serve no request",
        "type": "service_unavailable_error",
        "param": None,
        "code": "engine_dead",
    }
}


def workers(pid: int) -> list[int]:
    """The spawned multiprocessing children of ``pid`` (not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and spawned:
                found.append(int(entry.name))
    return found


def test_a_killed_worker_ends_the_stream_turns_health_503_and_exits_the_server(
    checkpoint, tmp_path
):
    model = checkpoint("llama")
    args = ("--tensor-parallel-size", "2", "--num-kv-blocks", "64", "--dtype", "float32")
    with ServerProcess(model, *args, log=tmp_path / "server.log") as server:
        assert server.process is not None
        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
        answer = server.post("/v1/completions", body)
        assert answer["usage"]["completion_tokens"] == 4
        (worker,) = workers(server.process.pid)
        stream = urllib.request.urlopen(
            urllib.request.Request(
                server.url + "/v1/completions",
                data=json.dumps(
                    body | {"max_tokens": 400, "stream": True, "ignore_eos": True}
                ).encode(),
                headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
            ),
            timeout=30,
        )
        first = stream.readline()
        assert first.startswith(b"data: {")
        # A request still reading its body keeps the server up while the stream ends.
        held = socket.create_connection(("127.0.0.1", server.port))
        held.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{"
        )
        os.kill(worker, signal.SIGKILL)
        events = [e.strip() for e in stream.read().split(b"\n\n") if e.strip()]
        assert events[-2:] == [b"data: " + json.dumps(DEAD_EVENT).encode(), b"data: [DONE]"]
        assert server.status("/health") == 503
        assert server.status("/ready") == 503
        held.close()
        assert server.process.wait(30) == 1
    assert gone(worker)
    assert "exiting: the engine died" in (tmp_path / "server.log").read_text()
