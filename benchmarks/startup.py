"""Time from process start to first token: ``kvserve serve`` and ``vllm serve``, same model,
same run.

    python benchmarks/startup.py --vllm /work/vllm-venv/bin/vllm [--repeats 3]

For each model (the embedded demo model and the 134M benchmark model of checkpoint.py, both
served in float32) and each repetition, each server is started as a fresh process on a free
loopback port; the clock starts just before the spawn. Two times are taken: ``ready``, the
first ``GET /health`` answered 200 (polled every 50 ms), and ``first token``, the first
streamed chunk of one completion (16 prompt tokens, sent right after ``ready``). Then the
server gets SIGTERM. The servers alternate which goes first in each repetition.

Caches: each (server, model) pair gets one fresh cache directory for the whole run
(``XDG_CACHE_HOME``, ``TORCHINDUCTOR_CACHE_DIR``, ``VLLM_CACHE_ROOT``), so repetition 1 is a
cold start (vLLM compiles the model with torch.compile, kvserve builds its C decode kernel)
and the later ones are warm (the compiled artefacts are reused), as a pod with a persistent
cache volume would be.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch
from checkpoint import build_checkpoint
from machine import cpu_model, loadavg
from server_launch import (
    SERVERS,
    command,
    environment,
    free_port,
    spawn,
    stop,
    vllm_version,
    wait_ready,
)

HERE = Path(__file__).parent
DEMO_MODEL = HERE.parent / "server" / "default_model"
PROMPT = list(range(10, 26))
# What vLLM logs when its saved torch.compile artefact fails to load and it compiles again.
RECOMPILE_MARK = "Compiling model again due to a load failure"


@dataclass(frozen=True)
class Start:
    model: str
    server: str
    repetition: int
    ready_s: float
    first_token_s: float
    phases: dict[str, float]
    """kvserve's own ``kvserve:startup_phase_seconds`` (empty for vLLM)."""
    load: str
    """/proc/loadavg's 1-minute load average when the start ended."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vllm", metavar="VLLM", help="vLLM's `vllm` command (else vLLM is skipped)")
    p.add_argument("--models", nargs="+", choices=["demo", "134m"], default=["demo", "134m"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vllm-threads-bind", default=f"0-{os.cpu_count() - 1}")
    p.add_argument("--vllm-kvcache-gib", default="4")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one start may take")
    p.add_argument("--out", type=Path, default=HERE / "results" / "startup.md")
    return p.parse_args()


def first_token(url: str, timeout: float) -> None:
    """Returns when the first streamed chunk carrying a choice has arrived."""
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                return
    raise RuntimeError("the stream ended without a token")


def startup_phases(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    phases = {}
    for line in text.splitlines():
        if line.startswith("kvserve:startup_phase_seconds{"):
            head, value = line.rsplit(" ", 1)
            phase = head.split('phase="', 1)[1].split('"', 1)[0]
            phases[phase] = float(value)
    return phases


def start_once(
    server: str, name: str, model: Path, repetition: int, cache: Path, log: Path, args
) -> Start:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, began = spawn(
        command(server, model, port, args.vllm),
        environment(server, cache, args.vllm_threads_bind, args.vllm_kvcache_gib),
        log,
        f"{server} {name} repetition {repetition}",
    )
    try:
        ready = wait_ready(process, url, began, args.timeout, log)
        first_token(url, args.timeout)
        first = time.monotonic() - began
        phases = startup_phases(url) if server == "kvserve" else {}
    finally:
        stop(process)
    return Start(name, server, repetition, ready, first, phases, loadavg().split()[0])


def report(starts: list[Start], args: argparse.Namespace, header: list[str]) -> str:
    phase_names = ("load", "kv_alloc", "warmup")
    lines = [
        *header,
        "",
        "| model | server | start | ready (s) | first token (s) | kvserve phases: load / "
        "kv_alloc / warmup / before and after them (s) | load (1 min) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in starts:
        kind = "cold" if s.repetition == 1 else "warm"
        phases = "—"
        if s.phases:
            rest = s.ready_s - sum(s.phases[p] for p in phase_names)
            phases = " / ".join(f"{s.phases[p]:.2f}" for p in phase_names) + f" / {rest:.2f}"
        lines.append(
            f"| {s.model} | {s.server} | {s.repetition} ({kind}) | {s.ready_s:.1f} "
            f"| {s.first_token_s:.1f} | {phases} | {s.load} |"
        )
    lines += ["", "Medians of the warm starts (repetitions 2 and later) and the cold start:", ""]
    lines += ["| model | server | cold: ready (s) | cold: first token (s) | warm: ready (s) "
              "| warm: first token (s) |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for model in args.models:
        for server in SERVERS:
            mine = [s for s in starts if s.model == model and s.server == server]
            if not mine:
                continue
            cold = mine[0]
            warm = [s for s in mine if s.repetition > 1]
            ready = f"{statistics.median(s.ready_s for s in warm):.1f}" if warm else "—"
            first = f"{statistics.median(s.first_token_s for s in warm):.1f}" if warm else "—"
            lines.append(
                f"| {model} | {server} | {cold.ready_s:.1f} | {cold.first_token_s:.1f} "
                f"| {ready} | {first} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    servers = [s for s in SERVERS if s == "kvserve" or args.vllm]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = loadavg()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; /proc/loadavg: {load_before}")
    workdir = Path(tempfile.mkdtemp(prefix="kvserve-startup-"))
    models = {"demo": DEMO_MODEL}
    if "134m" in args.models:
        models["134m"] = build_checkpoint(workdir / "model-134m", torch.float32).directory
    log = workdir / "servers.log"
    starts: list[Start] = []
    for name in args.models:
        for repetition in range(1, args.repeats + 1):
            order = servers if repetition % 2 else servers[::-1]
            for server in order:
                cache = workdir / f"cache-{server}-{name}"
                s = start_once(server, name, models[name], repetition, cache, log, args)
                print(
                    f"{name} {server} #{repetition}: ready {s.ready_s:.1f} s, first token "
                    f"{s.first_token_s:.1f} s; /proc/loadavg {loadavg()}",
                    flush=True,
                )
                starts.append(s)
    header = [
        f"# Startup: process start to first token ({started})",
        "",
        f"Command: `python benchmarks/startup.py {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs.",
        f"/proc/loadavg before: {load_before}; after: {loadavg()}.",
        "kvserve: `kvserve serve --dtype float32` (defaults otherwise). vLLM: "
        + (
            f"{vllm_version(args.vllm)}, `vllm serve --dtype float32`, "
            f"VLLM_CPU_OMP_THREADS_BIND={args.vllm_threads_bind}, "
            f"VLLM_CPU_KVCACHE_SPACE={args.vllm_kvcache_gib} GiB."
            if args.vllm
            else "not run."
        ),
        "",
        "Ready: the first `GET /health` answered 200. First token: the first streamed chunk "
        "of one completion (16 prompt tokens) sent once ready. Both from just before the "
        "spawn. Repetition 1 starts with empty caches (cold); later ones reuse the compiled "
        "artefacts of the first (warm). Models: demo = the embedded demo model (Llama, 4 "
        "layers, hidden 128, 2.1 MB); 134m = benchmarks/checkpoint.py's random Llama "
        "(12 layers, hidden 768), both in float32.",
    ]
    recompiled = log.read_text(errors="replace").count(RECOMPILE_MARK)
    if args.vllm:
        header.append(
            f"\nvLLM's compile cache: {recompiled} of its {len(args.models) * (args.repeats - 1)} "
            f'warm starts logged "{RECOMPILE_MARK}" (the saved AOT artefact did not load, '
            "so it compiled again; only torch inductor's own cache was reused)."
        )
    text = report(starts, args, header)
    args.out.write_text(text)
    print(text)
    shutil.rmtree(workdir)  # kept when a start failed: its error names the servers' log there


if __name__ == "__main__":
    main()
