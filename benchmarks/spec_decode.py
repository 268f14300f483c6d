"""Speculative decoding on a CPU: n-gram drafts on and off, two workloads, 1 and 16 streams.

    python benchmarks/spec_decode.py [--quick] [--num-speculative-tokens 4]

Starts ``kvserve serve`` on SmolLM2-135M-Instruct (the default model's GGUF; a model that
copies, which prompt lookup needs: a random checkpoint does not) once without and once with
``--speculative-config '{"method": "ngram", ...}'``, one after the other, and streams
``/v1/completions`` (greedy, EOS ignored) with ``serving.py``'s client:

    code-edit  a function of the standard library and the instruction to rename one of its
               names and give the whole code back: the answer is mostly the prompt
    chat       serving.py's chat workload: random token-id prompts (32-128 tokens)

at 1 and at 16 concurrent streams. Reports inter-token latency p50/p99 (a chunk of k tokens
after a gap g counts as k gaps of g / k), output tokens/s and the acceptance rate (accepted
over proposed draft tokens, from the server's ``vllm:spec_decode_*`` counters). Not a test.
"""

import argparse
import asyncio
import inspect
import json
import random
import tempfile
import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import numpy as np
from machine import describe
from server_launch import command, environment, free_port, spawn, stop, wait_ready
from serving import FIRST_ID, Target, Workload, run_pool, tokenize

from kvserve.server import smollm2

HERE = Path(__file__).resolve().parent
CODE_SOURCES = (textwrap.wrap, textwrap.dedent, textwrap.indent, json.dumps, random.shuffle)
RENAMES = ("text", "width", "lines", "prefix", "obj", "x")
ACCEPTANCE = (
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


@dataclass
class Row:
    workload: str
    streams: int
    speculation: bool
    itl_ms: tuple[float, float]
    tokens_per_s: float
    acceptance: float | None


def code_edit_prompts(count: int) -> list[str]:
    """Chat-formatted requests to rewrite a standard-library function with a name changed;
    the assistant's turn starts the code block."""
    prompts = []
    for i in range(count):
        code = inspect.getsource(CODE_SOURCES[i % len(CODE_SOURCES)])
        code = "\n".join(code.splitlines()[:40])
        old = next((n for n in RENAMES if n in code), "self")
        prompts.append(
            f"<|im_start|>user\nRename `{old}` to `{old}_value` in this code and reply with the "
            f"whole code:\n```python\n{code}\n```<|im_end|>\n<|im_start|>assistant\n```python\n"
        )
    return prompts


async def counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    found = dict.fromkeys(ACCEPTANCE, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in found:
            found[name] = float(line.rsplit(" ", 1)[1])
    return found[ACCEPTANCE[0]], found[ACCEPTANCE[1]]


async def run(target: Target, args: argparse.Namespace, speculation: bool) -> list[Row]:
    rows = []
    rng = random.Random(args.seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        edits = [await tokenize(session, target, p) for p in code_edit_prompts(args.requests)]
        chats = [
            [rng.randrange(FIRST_ID, 49152) for _ in range(rng.randint(32, 128))]
            for _ in range(args.requests)
        ]
        for name, prompts in (("code-edit", edits), ("chat", chats)):
            for streams in (1, 16):
                count = args.single if streams == 1 else args.requests
                w = Workload(name, count, streams, (0, 0), args.max_tokens)
                drafted, accepted = await counters(session, target.url)
                began = time.perf_counter()
                records = await run_pool(session, target, w, prompts[:count])
                wall = time.perf_counter() - began
                drafted_after, accepted_after = await counters(session, target.url)
                failed = [r.error for r in records if r.error is not None]
                if failed:
                    raise RuntimeError(f"{name}: {failed[0]}")
                gaps = [g for r in records for g in r.itl]
                p50, p99 = np.percentile(gaps, [50, 99]) * 1000
                tokens = sum(r.output_tokens for r in records)
                proposed = drafted_after - drafted
                rate = (accepted_after - accepted) / proposed if proposed else None
                rows.append(
                    Row(
                        name,
                        min(streams, count),
                        speculation,
                        (p50, p99),
                        tokens / wall,
                        rate if speculation else None,
                    )
                )
                print(rows[-1], flush=True)
    return rows


def serve(args: argparse.Namespace, speculation: bool, log: Path, cache: Path) -> list[Row]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ["--max-model-len", "2048", "--max-num-seqs", "16"]
    if speculation:
        config = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens}
        config |= {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
        extra += ["--speculative-config", json.dumps(config)]
    argv = command("kvserve", smollm2.model_path(), port, None, args.dtype, extra)
    title = "speculation on" if speculation else "speculation off"
    process, began = spawn(argv, environment("kvserve", cache, "", ""), log, title)
    try:
        wait_ready(process, url, began, 600, log)
        target = Target(title, url, "kvserve", model="m", max_model_len=2048)
        return asyncio.run(run(target, args, speculation))
    finally:
        stop(process)


def report(rows: list[Row], args: argparse.Namespace, started: str) -> str:
    lines = [
        "# Speculative decoding (n-gram) on a CPU",
        "",
        f"`python benchmarks/spec_decode.py{' --quick' if args.quick else ''}`, {started}; "
        f"{describe()}. SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized, {args.dtype}), greedy, "
        f"EOS ignored, {args.max_tokens} output tokens; `--speculative-config "
        f'\'{{"method": "ngram", "num_speculative_tokens": {args.num_speculative_tokens}, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 5}\'`. '
        f"{args.single} requests one at a time (1 stream), {args.requests} at "
        f"min(16, {args.requests}) streams; the servers one after the other, "
        "OMP_NUM_THREADS=1 (OpenMP's spinning threads crawl on a shared machine). "
        "vLLM's CPU build is not installed here: no vLLM column.",
        "",
        "| workload | streams | ITL p50 off / on (ms) | ratio | ITL p99 off / on (ms) | "
        "out tok/s off / on | acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for off in [r for r in rows if not r.speculation]:
        on = next(
            r
            for r in rows
            if r.speculation and (r.workload, r.streams) == (off.workload, off.streams)
        )
        rate = f"{on.acceptance:.0%}" if on.acceptance is not None else "-"
        lines.append(
            f"| {off.workload} | {off.streams} | {off.itl_ms[0]:.1f} / {on.itl_ms[0]:.1f} | "
            f"{on.itl_ms[0] / off.itl_ms[0]:.2f}x | {off.itl_ms[1]:.1f} / {on.itl_ms[1]:.1f} | "
            f"{off.tokens_per_s:.1f} / {on.tokens_per_s:.1f} | {rate} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 + 4 requests, 32 tokens")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--single", type=int, default=4, help="requests of the 1-stream runs")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "spec-decode-cpu.md")
    args = p.parse_args()
    if args.quick:
        args.requests, args.single, args.max_tokens = 4, 2, 32
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="kvserve-spec-") as tmp:
        log = Path(tmp) / "servers.log"
        try:
            rows = serve(args, False, log, Path(tmp)) + serve(args, True, log, Path(tmp))
        except Exception:
            print(log.read_text()[-3000:])
            raise
    text = report(rows, args, started)
    print(text)
    if not args.quick:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
