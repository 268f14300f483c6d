"""A real ``kvserve serve`` process on a free port, for the server tests."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

API_KEY = "test-key"
KVSERVE = Path(sys.executable).parent / "kvserve"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``with ServerProcess(model, "--max-num-seqs", "4") as server:`` → ready to serve;
    ``model`` None: no ``--model`` (the default model, under its own name); ``api_key`` None:
    none asked for; ``address``: (host, port) to listen on instead of a free loopback port."""

    def __init__(
        self,
        model: Path | None,
        *args: str,
        log: Path,
        api_key: str | None = API_KEY,
        address: tuple[str, int] | None = None,
    ) -> None:
        host, self.port = address or ("127.0.0.1", _free_port())
        self.url = f"http://{host}:{self.port}"
        self.log = log
        named = [] if model is None else ["--model", str(model), "--served-model-name", "tiny"]
        self.command = [
            str(KVSERVE), "serve", *named,
            "--host", host, "--port", str(self.port),
            *(["--api-key", api_key] if api_key else []), *args,
        ]  # fmt: skip
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 120
        while self.status("/ready") != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.read().decode()

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def send(
        self, path: str, data: bytes | None, headers: dict[str, str] | None = None, method="POST"
    ) -> tuple[int, dict[str, str], bytes]:
        """Any request, sent as given with the API key: its status, headers and body."""
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {API_KEY}", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample on ``/metrics`` (labels beyond ``model_name`` as given)."""
        return sample(self.get("/metrics"), name, **labels)


def sample(exposition: str, name: str, **labels: str) -> float:
    """The value of one sample in a ``/metrics`` text (labels beyond ``model_name`` as given)."""
    wanted = {"model_name": "tiny", **labels}
    for line in exposition.splitlines():
        if line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            pairs = head[len(name) + 1 : -1].split(",")
            found = dict(p.split("=", 1) for p in pairs)
            if {k: v.strip('"') for k, v in found.items()} == wanted:
                return float(value)
    raise KeyError(name)
