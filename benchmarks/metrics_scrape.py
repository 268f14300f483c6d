"""Latency of ``GET /metrics`` on a real ``kvserve serve`` of the demo model, idle and while
a streaming load runs, for the code at a baseline commit and for this tree, in one run.

    . .venv/bin/activate
    python benchmarks/metrics_scrape.py --baseline 24c2d38

Each server runs alone, baseline then this tree, for ``--rounds`` rounds: a scraper
sends ``--scrapes`` requests on one keep-alive connection, one every ``--interval`` seconds
(an endpoint picker's 50 ms), and times each from send to the last byte of the body. Under
load, ``--concurrency`` clients stream completions of ``--max-tokens`` tokens back to back
until the scrapes end; the generation rate over the scrape window (from
``vllm:generation_tokens_total``) shows what the scrapes cost the engine. The baseline is
``git archive`` of the commit, imported ahead of the installed package. The machine may be
shared: compare the rows of one run, and read the load averages printed with them.
"""

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "server" / "default_model"
GENERATED = re.compile(rb"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", re.MULTILINE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="24c2d38", help="commit before the snapshot")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS of the server")
    parser.add_argument("--rounds", type=int, default=3, help="baseline, tree; repeated")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/metrics-scrape.md")
    return parser.parse_args(argv)


def baseline_tree(rev: str, into: Path) -> Path:
    """The package at ``rev`` as ``into/kvserve``; returns the directory to import it from."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
        timeout=120,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into / "kvserve", filter="data")
    return into


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``kvserve serve`` of the demo model on a free loopback port."""

    def __init__(self, import_from: Path | None, threads: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = os.environ | {"OMP_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
        if import_from is not None:
            env["PYTHONPATH"] = str(import_from)
        command = [sys.executable, "-m", "kvserve.server.cli", "serve", "--model", str(DEMO)]
        command += ["--served-model-name", "kvserve-demo"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.log = log

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log.read_text()}")
            try:
                async with session.get(self.url + "/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError("the server did not become ready")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def scrape(session: aiohttp.ClientSession, url: str, count: int, interval: float):
    """``count`` scrapes on one connection, one per ``interval``: latencies (s), last body."""
    latencies, body = [], b""
    next_at = time.monotonic()
    for _ in range(count):
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += interval
        start = time.perf_counter()
        async with session.get(url + "/metrics") as response:
            body = await response.read()
        latencies.append(time.perf_counter() - start)
    return latencies, body


async def stream_until(session, url: str, max_tokens: int, stop: asyncio.Event) -> None:
    body = {
        "model": "kvserve-demo",
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    while not stop.is_set():
        async with session.post(url + "/v1/completions", json=body) as response:
            async for _ in response.content:
                pass


def generated(body: bytes) -> float:
    match = GENERATED.search(body)
    return float(match.group(1)) if match else 0.0


async def measure(server: Server, args: argparse.Namespace, loaded: bool) -> dict:
    connector = aiohttp.TCPConnector(limit=1)
    async with (
        aiohttp.ClientSession(connector=connector) as scraper,
        aiohttp.ClientSession() as clients,
    ):
        await server.wait_ready(scraper)
        stop = asyncio.Event()
        load = []
        if loaded:
            load = [
                asyncio.create_task(stream_until(clients, server.url, args.max_tokens, stop))
                for _ in range(args.concurrency)
            ]
            await asyncio.sleep(2.0)  # every client streaming
        _, first = await scrape(scraper, server.url, 1, 0)
        start = time.perf_counter()
        latencies, last = await scrape(scraper, server.url, args.scrapes, args.interval)
        seconds = time.perf_counter() - start
        stop.set()
        await asyncio.gather(*load)
    ms = sorted(x * 1000 for x in latencies)
    return {
        "p50": statistics.median(ms),
        "p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "max": ms[-1],
        "tok_s": (generated(last) - generated(first)) / seconds,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def run_tree(name: str, import_from: Path | None, args, logs: Path) -> dict[str, dict]:
    results = {}
    for loaded in (False, True):
        server = Server(import_from, args.threads, logs / f"{name}-{loaded}.log")
        try:
            results["load" if loaded else "idle"] = asyncio.run(measure(server, args, loaded))
        finally:
            server.stop()
        print(name, "load" if loaded else "idle", results["load" if loaded else "idle"])
    return results


def report(args, runs: dict[str, dict[str, dict]], before_loadavg: str) -> str:
    lines = [
        "# `/metrics` scrape latency",
        "",
        f"`python benchmarks/metrics_scrape.py --baseline {args.baseline} --rounds {args.rounds}`: "
        f"{args.scrapes} "
        f"scrapes, one every {args.interval * 1000:.0f} ms on one keep-alive connection, "
        f"against `kvserve serve` of the demo model (`OMP_NUM_THREADS={args.threads}`); "
        f"load: {args.concurrency} clients streaming {args.max_tokens}-token completions "
        "back to back. Machine: "
        f"{os.cpu_count()} CPUs, shared; /proc/loadavg at start: {before_loadavg}.",
        "",
        "| round | code | load | p50 ms | p99 ms | max ms | generation tok/s | loadavg after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (round_, name), phases in runs.items():
        for phase, r in phases.items():
            lines.append(
                f"| {round_} | {name} | {phase} | {r['p50']:.2f} | {r['p99']:.2f} | "
                f"{r['max']:.2f} | {r['tok_s']:.0f} | {' '.join(r['loadavg'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    before_loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        baseline = baseline_tree(args.baseline, tmp_path)
        runs = {}
        for round_ in range(1, args.rounds + 1):
            for name, tree in ((f"baseline {args.baseline}", baseline), ("this tree", None)):
                runs[round_, name] = run_tree(name.split()[0], tree, args, tmp_path)
    text = report(args, runs, before_loadavg)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
