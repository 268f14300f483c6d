"""Speculative decoding on a CPU: n-gram drafts on and off, two workloads, 1 and 16 streams,
kvserve and (``--vllm``) vLLM in one run.

    python benchmarks/spec_decode.py [--vllm /work/vllm-venv/bin/vllm] [--quick]
    python benchmarks/spec_decode.py --vllm VLLM --dry-run     # the command lines, nothing run

Serves SmolLM2-135M-Instruct (the default model's GGUF, dequantized once into a Hugging Face
directory both servers load: vLLM's CPU build reads no GGUF; a model that copies, which prompt
lookup needs: a random checkpoint does not) with ``kvserve serve`` and, with ``--vllm VLLM``,
``vllm serve``, each once without and once with the same ``--speculative-config '{"method":
"ngram", ...}'`` (serving.py's ``started``: the same max_model_len, prefix caching and KV
budget), one server at a time, and streams ``/v1/completions`` (greedy, EOS ignored, the same
prompt ids for every server) with serving.py's client:

    code-edit  a function of the standard library and the instruction to rename one of its
               names and give the whole code back: the answer is mostly the prompt
    chat       serving.py's chat workload: random token-id prompts (32-128 tokens)

at 1 and at 16 concurrent streams. Reports inter-token latency p50/p99 (a chunk of k tokens
after a gap g counts as k gaps of g / k), output tokens/s and the acceptance rate (accepted
over proposed draft tokens, from each server's ``vllm:spec_decode_*`` counters). A server
that refuses to start is reported with the error its log ends on. Not a test.
"""

import argparse
import asyncio
import inspect
import json
import os
import random
import shlex
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import numpy as np
from gguf_export import export
from machine import describe
from server_launch import last_error, vllm_version
from serving import FIRST_ID, Target, Workload, describe_target, run_pool, server_argv, started

from kvserve.engine.tokenizer import load_tokenizer
from kvserve.server import smollm2

HERE = Path(__file__).resolve().parent
CODE_SOURCES = (textwrap.wrap, textwrap.dedent, textwrap.indent, json.dumps, random.shuffle)
RENAMES = ("text", "width", "lines", "prefix", "obj", "x")
ACCEPTANCE = (
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 16


@dataclass
class Row:
    server: str
    workload: str
    streams: int
    speculation: bool
    itl_ms: tuple[float, float]
    tokens_per_s: float
    acceptance: float | None


def speculative_config(args: argparse.Namespace) -> dict[str, object]:
    """vLLM's ``--speculative-config`` JSON, the same for both servers."""
    return {
        "method": "ngram",
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }


def more_flags(args: argparse.Namespace, speculation: bool) -> list[str]:
    """The flags both servers get on top of serving.py's: the batch cap and, with
    speculation, the config."""
    flags = ["--max-num-seqs", str(MAX_NUM_SEQS)]
    if speculation:
        flags += ["--speculative-config", json.dumps(speculative_config(args))]
    return flags


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


def workload_prompts(model: Path, args: argparse.Namespace) -> dict[str, list[list[int]]]:
    """Each workload's prompt ids, tokenized here once so that every server gets the same."""
    tokenizer = load_tokenizer(str(model))
    rng = random.Random(args.seed)
    edits = [
        tokenizer.encode(p, add_special_tokens=False) for p in code_edit_prompts(args.requests)
    ]
    chats = [
        [rng.randrange(FIRST_ID, len(tokenizer)) for _ in range(rng.randint(32, 128))]
        for _ in range(args.requests)
    ]
    return {"code-edit": edits, "chat": chats}


async def counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    found = dict.fromkeys(ACCEPTANCE, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found[ACCEPTANCE[0]], found[ACCEPTANCE[1]]


async def run(
    target: Target, prompts: dict[str, list[list[int]]], args: argparse.Namespace, speculation: bool
) -> list[Row]:
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await describe_target(session, target, MAX_MODEL_LEN)
        for name, ids in prompts.items():
            for streams in (1, 16):
                count = args.single if streams == 1 else args.requests
                w = Workload(name, count, streams, (0, 0), args.max_tokens)
                drafted, accepted = await counters(session, target.url)
                began = time.perf_counter()
                records = await run_pool(session, target, w, ids[:count])
                wall = time.perf_counter() - began
                drafted_after, accepted_after = await counters(session, target.url)
                failed = [r.error for r in records if r.error is not None]
                if failed:
                    raise RuntimeError(f"{target.name} {name}: {failed[0]}")
                gaps = [g for r in records for g in r.itl]
                p50, p99 = np.percentile(gaps, [50, 99]) * 1000
                tokens = sum(r.output_tokens for r in records)
                proposed = drafted_after - drafted
                rate = (accepted_after - accepted) / proposed if proposed else None
                rows.append(
                    Row(
                        target.name,
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


def refusal(log: Path) -> str:
    """The error the servers' log's last section (the server that failed) ends on."""
    return last_error(log.read_text(errors="replace").rsplit("\n=== ", 1)[-1])


def serve(
    server: str,
    speculation: bool,
    model: Path,
    prompts: dict[str, list[list[int]]],
    args: argparse.Namespace,
    workdir: Path,
) -> tuple[list[Row], str | None, str]:
    """One server's rows (none if it refused to start, with its error) and its command."""
    log = workdir / "servers.log"
    try:
        more = more_flags(args, speculation)
        with started(server, model, args, workdir, log, 0, more) as target:
            print(f"{target.command}: ready after {target.ready_s:.1f} s", flush=True)
            return asyncio.run(run(target, prompts, args, speculation)), None, target.command
    except RuntimeError as exc:
        if "exited with" not in str(exc):
            print(log.read_text(errors="replace")[-3000:])
            raise
        error = refusal(log)
        print(f"{server} refused to start: {error}", flush=True)
        return [], error, ""


def rows_table(rows: list[Row]) -> list[str]:
    """Per server, workload and streams: speculation off against on (a dash where the
    speculating server did not start)."""
    lines = [
        "| server | workload | streams | ITL p50 off / on (ms) | on ÷ off | ITL p99 off / on (ms) "
        "| out tok/s off / on | acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for off in [r for r in rows if not r.speculation]:
        key = (off.server, off.workload, off.streams)
        on = next(
            (r for r in rows if r.speculation and (r.server, r.workload, r.streams) == key), None
        )
        if on is None:
            lines.append(
                f"| {off.server} | {off.workload} | {off.streams} | {off.itl_ms[0]:.1f} / - | - "
                f"| {off.itl_ms[1]:.1f} / - | {off.tokens_per_s:.1f} / - | - |"
            )
            continue
        rate = f"{on.acceptance:.0%}" if on.acceptance is not None else "-"
        lines.append(
            f"| {off.server} | {off.workload} | {off.streams} | {off.itl_ms[0]:.1f} / "
            f"{on.itl_ms[0]:.1f} | {on.itl_ms[0] / off.itl_ms[0]:.2f}x | {off.itl_ms[1]:.1f} / "
            f"{on.itl_ms[1]:.1f} | {off.tokens_per_s:.1f} / {on.tokens_per_s:.1f} | {rate} |"
        )
    return lines


def ratio_table(rows: list[Row]) -> list[str]:
    """kvserve ÷ vLLM, speculation off and on, per workload and streams."""
    lines = [
        "| workload | streams | ITL p50 kvserve ÷ vLLM, off / on | ITL p99 kvserve ÷ vLLM, "
        "off / on | out tok/s kvserve ÷ vLLM, off / on |",
        "| --- | --- | --- | --- | --- |",
    ]
    keyed = {(r.server, r.workload, r.streams, r.speculation): r for r in rows}
    metrics = (lambda r: r.itl_ms[0], lambda r: r.itl_ms[1], lambda r: r.tokens_per_s)
    for r in rows:
        if r.server != "kvserve" or r.speculation:
            continue
        cells = []
        for metric in metrics:
            ratios = []
            for speculation in (False, True):
                ours = keyed.get(("kvserve", r.workload, r.streams, speculation))
                theirs = keyed.get(("vllm", r.workload, r.streams, speculation))
                ratios.append(f"{metric(ours) / metric(theirs):.2f}x" if ours and theirs else "-")
            cells.append(" / ".join(ratios))
        lines.append(f"| {r.workload} | {r.streams} | {' | '.join(cells)} |")
    return lines


def report(
    rows: list[Row],
    refused: dict[tuple[str, bool], str],
    commands: list[str],
    args: argparse.Namespace,
    started_at: str,
) -> str:
    config = json.dumps(speculative_config(args))
    servers = "kvserve serve and vllm serve" if args.vllm else "kvserve serve"
    lines = [
        "# Speculative decoding (n-gram) on a CPU",
        "",
        f"`python benchmarks/spec_decode.py {' '.join(args.argv)}`, {started_at}; {describe()}"
        + (f"; vLLM {vllm_version(args.vllm)}" if args.vllm else "")
        + ". SmolLM2-135M-Instruct (its Q4_1 GGUF dequantized to a float32 Hugging Face "
        f"directory, served in {args.dtype}), greedy, EOS ignored, {args.max_tokens} output "
        f"tokens; `--speculative-config '{config}'`. {args.single} requests one at a time "
        f"(1 stream), {args.requests} at min(16, {args.requests}) streams; {servers}, one at a "
        f"time, speculation off then on; OMP_NUM_THREADS={args.threads} for both"
        + (f", vLLM's VLLM_CPU_OMP_THREADS_BIND={args.vllm_threads_bind}" if args.vllm else "")
        + f", KV cache {args.kv_cache_gib} GiB each.",
        "",
        "Servers:",
        "",
        *[f"- `{c}`" for c in commands],
        *[
            f"- {server} with speculation {'on' if on else 'off'} refused to start: `{error}`"
            for (server, on), error in refused.items()
        ],
        "",
        *rows_table(rows),
    ]
    if {r.server for r in rows} == {"kvserve", "vllm"}:
        lines += ["", *ratio_table(rows)]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vllm", metavar="VLLM", help="also run `VLLM serve` (VLLM: vLLM's CLI)")
    p.add_argument("--dry-run", action="store_true", help="print the servers' command lines")
    p.add_argument("--quick", action="store_true", help="2 + 4 requests, 32 tokens")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--single", type=int, default=4, help="requests of the 1-stream runs")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--kv-cache-gib", default="2", help="each server's KV-cache budget")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both servers "
                   "(1: OpenMP's spinning threads crawl on a shared machine)")  # fmt: skip
    p.add_argument("--vllm-threads-bind", default="nobind", help="vLLM's VLLM_CPU_OMP_"
                   "THREADS_BIND (nobind: --threads threads, unbound, as kvserve's)")  # fmt: skip
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds a start may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "spec-decode-cpu.md")
    args = p.parse_args(argv)
    for flag in ("requests", "single", "max_tokens", "num_speculative_tokens", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.vllm and not (Path(args.vllm).is_file() and os.access(args.vllm, os.X_OK)):
        p.error(f"--vllm {args.vllm}: not an executable file (vLLM's `vllm` command)")
    if args.quick:
        args.requests, args.single, args.max_tokens = 4, 2, 32
    # What serving.py's `started` reads: the same for both servers.
    args.max_model_len, args.block_size = MAX_MODEL_LEN, None
    args.argv = sys.argv[1:] if argv is None else argv
    args.servers = ["kvserve", "vllm"] if args.vllm else ["kvserve"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="kvserve-spec-") as tmp:
        workdir = Path(tmp)
        model = workdir / "smollm2-135m-instruct"
        if args.dry_run:
            for speculation in (False, True):
                for server in args.servers:
                    argv = server_argv(server, model, args, 0, more_flags(args, speculation))
                    print(shlex.join(argv))
            return
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the servers' environments copy it
        export(smollm2.fetch(), model)
        prompts = workload_prompts(model, args)
        rows: list[Row] = []
        refused: dict[tuple[str, bool], str] = {}
        commands = []
        for speculation in (False, True):
            for server in args.servers:
                mine, error, command = serve(server, speculation, model, prompts, args, workdir)
                rows += mine
                commands += [command] if command else []
                if error is not None:
                    refused[server, speculation] = error
    text = report(rows, refused, commands, args, started_at)
    print(text)
    if not args.quick:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
