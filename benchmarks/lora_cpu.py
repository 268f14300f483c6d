"""Multi-LoRA on a CPU: W1 (throughput.py's workload) on the same random model with the
base model alone (LoRA off), then with LoRA on and 0, 1 and 4 rank-16 adapters (all seven
target modules) mixed into the batch, one after another in one run.

    python benchmarks/lora_cpu.py [--quick] [--requests N] [--max-tokens N]

With 1 adapter, every other request runs under it; with 4, the requests take turns over
the four adapters and the base model. LoRA on also turns off the recorded CPU decode steps
(a step's adapter row groups are not part of a recording): the "0 adapters" row shows that
cost alone. The base model runs again last: the spread between its two rows is what the
order of the runs (and a shared machine) accounts for. Not a test.
"""

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from checkpoint import build_checkpoint
from machine import describe
from throughput import Workload

from kvserve import LLM, LoRARequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from lora_adapters import build_adapter

HERE = Path(__file__).resolve().parent
RANK = 16


def timed(llm: LLM, workload: Workload, loras: list[LoRARequest | None]) -> tuple[float, int]:
    """Wall seconds and output tokens of the workload, request i under ``loras[i % len]``."""
    params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    per_prompt = [loras[i % len(loras)] for i in range(len(workload.prompts))]
    llm.generate(workload.prompts[:4], params, lora_request=per_prompt[:4])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, lora_request=per_prompt)
    wall = time.perf_counter() - start
    return wall, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "lora-cpu.md")
    args = p.parse_args()
    if args.quick:
        args.requests, args.max_tokens = 8, 16
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvserve-lora-") as tmp:
        model = build_checkpoint(Path(tmp) / "model", torch.bfloat16, args.seed).directory
        adapters = [
            LoRARequest(f"a{i}", i, str(build_adapter(model, Path(tmp) / f"a{i}", RANK, i)))
            for i in range(1, 5)
        ]
        settings = dict(dtype="bfloat16", max_model_len=1024)
        lora = dict(settings, enable_lora=True, max_loras=4, max_lora_rank=RANK)
        runs = [
            ("base model alone (LoRA off)", settings, [None]),
            ("LoRA on, 0 adapters in the batch", lora, [None]),
            ("LoRA on, 1 adapter (every other request)", lora, [adapters[0], None]),
            ("LoRA on, 4 adapters and the base model in turn", lora, [*adapters, None]),
            ("base model alone again (order effects)", settings, [None]),
        ]
        base_rate = None
        for name, config, loras in runs:
            wall, tokens = timed(LLM(str(model), **config), workload, loras)
            rate = tokens / wall
            base_rate = base_rate or rate
            rows.append(f"| {name} | {wall:.1f} | {rate:.1f} | {rate / base_rate:.2f}x |")
            print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        f"# Multi-LoRA on a CPU ({started})",
        "",
        describe(),
        "",
        f"W1: {args.requests} requests, prompts of {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.max_tokens} output tokens each (greedy), llama-134m in bf16, rank-{RANK} "
        "adapters on q/k/v/o and gate/up/down, one run each, in this order, in one process.",
        "",
        "| run | W1 wall (s) | output tok/s | vs the base model alone |",
        "| --- | ---: | ---: | ---: |",
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
