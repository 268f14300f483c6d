"""Async scheduling on a CPU: W1 (throughput.py's workload, offline) with ``async_scheduling``
off and on, taking turns in one process, then the served benchmark (serving.py) with
``kvserve serve`` and ``kvserve serve --async-scheduling`` taking turns; one report.

    python benchmarks/async_scheduling_cpu.py [--quick] [--rounds N] [--no-serving]

W1 runs the same random llama-134m in bf16, greedy, EOS ignored; after one unreported run
(the process's one-time costs), each round runs sync and async (the order swapped every other
round), each on a fresh engine after a warm-up, so the rounds' spread shows the machine's
noise.
The ratio is the median async rate over the median sync rate. Not a test.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from checkpoint import build_checkpoint
from machine import describe
from throughput import Workload

from kvserve import LLM, SamplingParams

HERE = Path(__file__).resolve().parent


def timed(llm: LLM, workload: Workload) -> tuple[float, int]:
    """Wall seconds and output tokens of the workload (after a warm-up of 4 requests)."""
    params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(workload.prompts[:4], params)
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params)
    wall = time.perf_counter() - start
    return wall, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, the cores)")
    p.add_argument("--no-serving", action="store_true", help="W1 only")
    p.add_argument("--serving-args", default="--workloads chat burst --scale 0.5")
    p.add_argument("--out", type=Path, default=HERE / "results" / "async-scheduling-cpu.md")
    args = p.parse_args()
    if args.quick:
        args.requests, args.max_tokens = 8, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows, rates = [], {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="kvserve-async-") as tmp:
        model = build_checkpoint(Path(tmp) / "model", torch.bfloat16, args.seed).directory
        # the process's one-time costs (the first engine built in it) fall on no row
        timed(LLM(str(model), dtype="bfloat16", max_model_len=1024), workload)
        for round_ in range(args.rounds):
            for on in (False, True) if round_ % 2 == 0 else (True, False):
                llm = LLM(str(model), dtype="bfloat16", max_model_len=1024, async_scheduling=on)
                wall, tokens = timed(llm, workload)
                llm.engine.shutdown()
                rates[on].append(tokens / wall)
                name = "async" if on else "sync"
                rows.append(f"| {round_ + 1} | {name} | {wall:.2f} | {tokens / wall:.1f} |")
                print(rows[-1], file=sys.stderr, flush=True)
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    lines = [
        f"# Async scheduling on a CPU ({started})",
        "",
        describe(),
        "",
        f"Command: `python benchmarks/async_scheduling_cpu.py {' '.join(sys.argv[1:])}`",
        "",
        f"## W1, offline: {args.requests} requests, prompts of {args.min_prompt}-"
        f"{args.max_prompt} tokens, {args.max_tokens} output tokens each (greedy), "
        f"llama-134m in bf16, {torch.get_num_threads()} torch threads, sync and async taking "
        "turns in one process",
        "",
        "| round | scheduling | W1 wall (s) | output tok/s |",
        "| ---: | --- | ---: | ---: |",
        *rows,
        "",
        f"Async ÷ sync, medians of output tok/s: **{ratio:.2f}x**.",
    ]
    if not args.no_serving:
        served = Path(tmp).with_name(Path(tmp).name + "-serving.md")
        command = [
            sys.executable,
            str(HERE / "serving.py"),
            "--kvserve",
            "--kvserve-async",
            "--dtype",
            "bfloat16",
            "--rounds",
            str(args.rounds),
            *args.serving_args.split(),
            "--out",
            str(served),
        ]
        subprocess.run(command, check=True)
        body = served.read_text().split("\n", 1)[1]
        lines += ["", "## Served (serving.py): kvserve and kvserve-async taking turns", body]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
