"""Multi-LoRA on a CPU: W1 (throughput.py's workload) on the same random model with the
base model alone (LoRA off), then with LoRA on and 0, 1 and 4 rank-16 adapters (all seven
target modules) mixed into the batch, one after another in one run; with ``--vllm PYTHON``
the same runs of vLLM's ``LLM(enable_lora=True, max_loras=4, max_lora_rank=16)`` with
``LoRARequest``s on the same adapters, each right after kvserve's.

    python benchmarks/lora_cpu.py [--quick] [--requests N] [--max-tokens N]
                                  [--vllm /work/vllm-venv/bin/python]

With 1 adapter, every other request runs under it; with 4, the requests take turns over
the four adapters and the base model. LoRA on also turns off kvserve's recorded CPU decode
steps (a step's adapter row groups are not part of a recording) and vLLM's torch.compile:
the "0 adapters" row shows that cost alone. kvserve runs in this process (each run a new
``LLM``); vLLM in a process of its own per run (throughput.py's ``run_engine``, the
``vllm`` runner of runners.py, in vLLM's venv). The base model runs again last: the spread
between its two rows is what the order of the runs (and a shared machine) accounts for.
A vLLM run that fails is reported with the error its log ends on. Not a test.
"""

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from checkpoint import build_checkpoint
from machine import describe
from throughput import Workload, run_engine

from kvserve import LLM, LoRARequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from lora_adapters import build_adapter

HERE = Path(__file__).resolve().parent
RANK = 16
MAX_LORAS = 4
MAX_MODEL_LEN = 1024
Loras = list[LoRARequest | None]


def runs(adapters: list[LoRARequest]) -> list[tuple[str, bool, Loras]]:
    """(name, LoRA on, the adapters requests take in turn) of every run, in order."""
    return [
        ("base model alone (LoRA off)", False, [None]),
        ("LoRA on, 0 adapters in the batch", True, [None]),
        ("LoRA on, 1 adapter (every other request)", True, [adapters[0], None]),
        ("LoRA on, 4 adapters and the base model in turn", True, [*adapters, None]),
        ("base model alone again (order effects)", False, [None]),
    ]


def timed(llm: LLM, workload: Workload, loras: Loras) -> tuple[float, int]:
    """Wall seconds and output tokens of the workload, request i under ``loras[i % len]``."""
    params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    per_prompt = [loras[i % len(loras)] for i in range(len(workload.prompts))]
    llm.generate(workload.prompts[:4], params, lora_request=per_prompt[:4])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, lora_request=per_prompt)
    wall = time.perf_counter() - start
    return wall, sum(len(o.outputs[0].token_ids) for o in outputs)


def vllm_spec(model: Path, workload: Workload, lora: bool, loras: Loras) -> dict[str, Any]:
    """The spec of runners.py's ``vllm`` runner for one run: the same prompts, warm-up
    prompts and adapters (as ``[name, id, path]``) as kvserve's."""
    spec: dict[str, Any] = {
        "engine": "vllm",
        "model": str(model),
        "dtype": "bfloat16",
        "max_model_len": MAX_MODEL_LEN,
        "prompts": workload.prompts,
        "max_tokens": workload.max_tokens,
        "warmup_prompts": workload.prompts[:4],
    }
    if lora:
        adapters = [a and [a.lora_name, a.lora_int_id, a.lora_path] for a in loras]
        spec["lora"] = {"max_loras": MAX_LORAS, "max_lora_rank": RANK, "adapters": adapters}
    return spec


def cells(wall: float, tokens: int, base: float) -> str:
    rate = tokens / wall
    return f"{wall:.1f} | {rate:.1f} | {rate / base:.2f}x"


def table(rows: list[tuple[str, tuple[float, int], dict[str, Any] | None]]) -> list[str]:
    """One line per run: kvserve's wall, rate and ratio to its first run; with vLLM, the
    same for vLLM (or its error) and kvserve ÷ vLLM."""
    with_vllm = any(v is not None for _, _, v in rows)
    head = "| run | kvserve W1 wall (s) | output tok/s | vs the base model alone |"
    rule = "| --- | ---: | ---: | ---: |"
    if with_vllm:
        head += " vLLM W1 wall (s) | output tok/s | vs the base model alone | kvserve ÷ vLLM |"
        rule += " ---: | ---: | ---: | ---: |"
    lines = [head, rule]
    kv_base = rows[0][1][1] / rows[0][1][0]
    vllm_base = next(
        (v["output_tokens"] / v["wall_s"] for _, _, v in rows if v and "wall_s" in v), 0
    )
    for name, (wall, tokens), vllm in rows:
        line = f"| {name} | {cells(wall, tokens, kv_base)} |"
        if vllm is not None and "wall_s" in vllm:
            ratio = (tokens / wall) / (vllm["output_tokens"] / vllm["wall_s"])
            line += f" {cells(vllm['wall_s'], vllm['output_tokens'], vllm_base)} | {ratio:.2f}x |"
        elif vllm is not None:
            line += f" failed: {vllm['error']} | - | - | - |"
        lines.append(line)
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm", metavar="PYTHON", help="python of vLLM's own venv (else skipped)")
    p.add_argument("--vllm-threads-bind", default=f"0-{os.cpu_count() - 1}")
    p.add_argument("--vllm-kvcache-gib", default="2")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per vLLM run")
    p.add_argument("--out", type=Path, default=HERE / "results" / "lora-cpu.md")
    args = p.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        p.error("--requests and --max-tokens must be at least 1")
    if args.vllm and not (Path(args.vllm).is_file() and os.access(args.vllm, os.X_OK)):
        p.error(f"--vllm {args.vllm}: not an executable file (the python of vLLM's venv)")
    if args.quick:
        args.requests, args.max_tokens = 8, 16
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
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
        settings = dict(dtype="bfloat16", max_model_len=MAX_MODEL_LEN)
        lora_settings = dict(enable_lora=True, max_loras=MAX_LORAS, max_lora_rank=RANK)
        for i, (name, lora, loras) in enumerate(runs(adapters)):
            config = settings | (lora_settings if lora else {})
            kvserve = timed(LLM(str(model), **config), workload, loras)
            vllm = None
            if args.vllm:
                (Path(tmp) / f"run{i}").mkdir()
                spec = vllm_spec(model, workload, lora, loras)
                vllm = run_engine("vllm", spec, args, Path(tmp) / f"run{i}")
            rows.append((name, kvserve, vllm))
            print(table(rows)[-1], file=sys.stderr, flush=True)
    errors = sorted({v["message"] for _, _, v in rows if v and "message" in v})
    version = next((v["version"] for _, _, v in rows if v and "version" in v), "failed")
    lines = [
        f"# Multi-LoRA on a CPU ({started})",
        "",
        f"`python benchmarks/lora_cpu.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        describe() + (f"; vLLM {version}" if args.vllm else ""),
        "",
        f"W1: {args.requests} requests, prompts of {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.max_tokens} output tokens each (greedy), llama-134m in bf16, rank-{RANK} "
        "adapters on q/k/v/o and gate/up/down, one run each, in this order"
        + (
            "; kvserve in one process, each vLLM run in a process of its own right after "
            f"kvserve's (VLLM_CPU_OMP_THREADS_BIND={args.vllm_threads_bind}, prefix caching "
            f"off, max_loras {MAX_LORAS}, max_lora_rank {RANK})."
            if args.vllm
            else ", in one process."
        ),
        "",
        *table(rows),
        *(["", "vLLM's errors:", "", *[f"- `{e}`" for e in errors]] if errors else []),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
