"""Starting and stopping ``kvserve serve`` and ``vllm serve`` for the benchmarks (startup.py,
serving.py): the command lines, the environment, a free loopback port, the wait for
``GET /health``, SIGTERM.

Each server runs in a session of its own (``start_new_session``), so that ``stop`` can end
vLLM's engine process, a child of the one it spawned, with the process group.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

KVSERVE = Path(sys.executable).parent / "kvserve"
POLL_SECONDS = 0.05
SERVERS = ("kvserve", "vllm")
MODEL_NAME = "m"
"""The name both servers serve the model under (``--served-model-name``)."""
_ERROR = re.compile(r"\b\w*(Error|Exception)\b: .+")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(
    server: str,
    model: Path,
    port: int,
    vllm: str | None,
    dtype: str = "float32",
    extra: Sequence[str] = (),
) -> list[str]:
    """``kvserve serve`` (next to this Python) or ``vllm serve`` (the `vllm` CLI at `vllm`)."""
    common = ["--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port)]
    common += ["--dtype", dtype, *extra]
    if server == "kvserve":
        return [str(KVSERVE), "serve", "--model", str(model), *common]
    if vllm is None:
        raise ValueError("vllm serve needs the path of the `vllm` command")
    return [vllm, "serve", str(model), *common]


def environment(server: str, cache: Path, threads_bind: str, kvcache_gib: str) -> dict[str, str]:
    """Offline, with every compile cache under `cache`; vLLM's threads bound to
    `threads_bind` and a KV cache of `kvcache_gib` GiB."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env |= {"XDG_CACHE_HOME": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    if server == "vllm":
        env |= {
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "VLLM_CPU_OMP_THREADS_BIND": threads_bind,
            "VLLM_CPU_KVCACHE_SPACE": kvcache_gib,
        }
    return env


def spawn(
    argv: list[str], env: dict[str, str], log: Path, title: str
) -> tuple[subprocess.Popen, float]:
    """Start `argv` with its output appended to `log` after a ``=== title`` line; returns
    the process and the ``time.monotonic()`` just before the spawn."""
    with log.open("ab") as out:
        out.write(f"\n=== {title}\n".encode())
        out.flush()
        began = time.monotonic()
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process, began


def health(url: str) -> int:
    """The status of ``GET /health``; 0 while nothing answers."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def wait_ready(
    process: subprocess.Popen, url: str, began: float, timeout: float, log: Path
) -> float:
    """Seconds from `began` (a ``time.monotonic()``) to the first ``GET /health`` answered
    200, polled every POLL_SECONDS; raises if the process exits or `timeout` passes first."""
    while health(url) != 200:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}; see {log}")
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{process.args[0]} not ready after {timeout:.0f} s; see {log}")
        time.sleep(POLL_SECONDS)
    return time.monotonic() - began


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL to the process group it leads (vLLM's engine is a child)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def vllm_version(vllm: str) -> str:
    python = Path(vllm).parent / "python"
    code = "from importlib.metadata import version; print(version('vllm-cpu'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def last_error(log: str) -> str:
    """The error a process's output ends on: its last ``SomeError: message`` (without what
    precedes it on the line, as a process id), else its last line."""
    lines = log.strip().splitlines()
    errors = [m.group(0) for line in lines if (m := _ERROR.search(line))]
    return errors[-1] if errors else (lines[-1] if lines else "")
