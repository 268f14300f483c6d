"""Offline throughput of kvserve against transformers and vLLM on one random-weight model.

    python benchmarks/throughput.py [--dtype bf16 fp32] [--vllm VLLM_PYTHON] [--rounds N] [--quick]
                                    [--shape qwen2-0.5b]

Workload: 64 requests, prompt lengths uniform in 32–512 (seeded random token ids, the same
for every engine), 128 output tokens each, greedy, EOS ignored, prefix caching off. Each
engine runs in a process of its own, --rounds times, the engines taking turns in every
round (a shared machine drifts by ±15 % within minutes: a ratio of two runs minutes apart
is noise, the median of paired rounds is not); the table goes to stdout and to --out. The
model is checkpoint.py's 134M Llama (W1) or, with --shape, another of its shapes. See
README.md.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from checkpoint import PROMPT_IDS, SHAPES, Checkpoint, build_checkpoint
from machine import copy_bandwidth_gbs, describe, load_average, matmul_gflops
from server_launch import last_error

HERE = Path(__file__).resolve().parent
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ENGINES = {
    "kvserve": "kvserve `LLM.generate`",
    "vllm": "vLLM `LLM.generate`",
    "hf_static": "transformers `generate`, static batches",
    "hf_continuous": "transformers `generate_batch` (continuous batching)",
    "hf_single": "transformers `generate`, one request at a time",
}


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: int

    @classmethod
    def random(cls, n: int, min_len: int, max_len: int, max_tokens: int, seed: int) -> "Workload":
        rng = random.Random(seed)
        lengths = [rng.randint(min_len, max_len) for _ in range(n)]
        # Ids 0 and 1 are the checkpoint's EOS and BOS: prompts use neither.
        return cls([[rng.randint(*PROMPT_IDS) for _ in range(k)] for k in lengths], max_tokens)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    p.add_argument("--vllm", metavar="PYTHON", help="python of vLLM's own venv (else skipped)")
    p.add_argument("--vllm-threads-bind", default=f"0-{os.cpu_count() - 1}")
    p.add_argument("--vllm-kvcache-gib", default="4")
    p.add_argument("--shape", choices=list(SHAPES), default="llama-134m", help="the model")
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="static batches' size")
    p.add_argument(
        "--single-requests",
        type=int,
        help="run the one-at-a-time baseline on only the first N requests (it is the slowest)",
    )
    p.add_argument("--rounds", type=int, default=1, help="runs of each engine, taking turns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    p.add_argument("--out", type=Path, default=HERE / "results" / "latest.md")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens = 8, 16
    if "vllm" in args.engines and not args.vllm:
        args.engines.remove("vllm")
    return args


def run_engine(
    engine: str, spec: dict[str, Any], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Run one engine in its own process; its result, or {"error": ...} if it failed."""
    spec_path, result_path = workdir / f"{engine}.json", workdir / f"{engine}.result.json"
    log_path = workdir / f"{engine}.log"
    spec_path.write_text(json.dumps(spec))
    python = args.vllm if engine == "vllm" else sys.executable
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if engine == "vllm":
        env |= {
            "VLLM_CPU_OMP_THREADS_BIND": args.vllm_threads_bind,
            "VLLM_CPU_KVCACHE_SPACE": args.vllm_kvcache_gib,
        }
    command = [python, str(HERE / "runners.py"), str(spec_path), str(result_path)]
    with open(log_path, "w") as log:
        try:
            subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                           timeout=args.timeout, check=True)  # fmt: skip
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            text = log_path.read_text()
            tail = text.strip().splitlines()[-15:]
            print(f"  {engine} failed ({e}); log tail:", *tail, sep="\n    ", file=sys.stderr)
            return {"error": type(e).__name__, "message": last_error(text)}
    return json.loads(result_path.read_text())


def prepare_dtype(
    dtype: str, workload: Workload, args: argparse.Namespace, workdir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint, the floors' measurements and the runners' spec for one dtype."""
    ckpt = build_checkpoint(workdir / f"model-{dtype}", DTYPES[dtype], args.seed, args.shape)
    rng = random.Random(args.seed + 1)
    spec = {
        "model": str(ckpt.directory),
        "dtype": {"bf16": "bfloat16", "fp32": "float32"}[dtype],
        "prompts": workload.prompts,
        "max_tokens": workload.max_tokens,
        "warmup_prompts": [[rng.randint(*PROMPT_IDS) for _ in range(n)] for n in (40, 90, 200)],
        "single_prompt": [rng.randint(*PROMPT_IDS) for _ in range(128)],
        "decode_steps": 32,
        "batch_size": args.batch_size,
        "max_model_len": 1024,
    }
    run = {
        "checkpoint": ckpt,
        "results": {},
        "bandwidth_gbs": copy_bandwidth_gbs(),
        "gflops": matmul_gflops(DTYPES[dtype]),
    }
    return run, spec


def run_one(
    engine: str, dtype: str, spec: dict[str, Any], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """One engine's run in one dtype, with the load average when it ended."""
    if engine == "hf_single" and args.single_requests:
        spec = spec | {"prompts": spec["prompts"][: args.single_requests]}
    print(f"[{dtype}] {engine} ...", file=sys.stderr, flush=True)
    result = run_engine(engine, spec | {"engine": engine}, args, workdir / dtype)
    result["load"] = os.getloadavg()[0]
    if "wall_s" in result:
        rate = result["output_tokens"] / result["wall_s"]
        print(f"  {result['wall_s']:.1f} s, {rate:.1f} out tok/s", file=sys.stderr, flush=True)
    return result


def _rate(result: dict[str, Any]) -> float:
    return result["output_tokens"] / result["wall_s"]


def engine_table(dtype: str, run: dict[str, Any]) -> list[str]:
    """One row per engine: its median round, the spread of its rounds, and kvserve's median
    ratio to it over the rounds that both finished (round i of each, run minutes apart)."""
    results = run["results"]  # engine -> its rounds' results, in order
    ok = {e: [r for r in rounds if "wall_s" in r] for e, rounds in results.items()}
    ref_name = next((e for e in ("kvserve", "hf_single") if ok.get(e)), None)
    ref = ok[ref_name][0] if ref_name else None
    lines = [
        f"| {dtype}: engine | requests | rounds | wall s (median) | out tok/s (median) "
        f"| out tok/s (min–max) | kvserve ÷ it (median of rounds) "
        f"| same tokens as {ref_name or '—'} | load after |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for engine, rounds in results.items():
        loads = "/".join(f"{r['load']:.1f}" for r in rounds)
        if not ok[engine]:
            error = rounds[-1]["error"]
            lines.append(
                f"| {ENGINES[engine]} | — | {len(rounds)} | failed: {error} | — | — | — | — "
                f"| {loads} |"
            )
            continue
        rates = [_rate(r) for r in ok[engine]]
        paired = [
            _rate(k) / _rate(r)
            for k, r in zip(results.get("kvserve", []), rounds, strict=False)
            if "wall_s" in k and "wall_s" in r
        ]
        ratio = f"{statistics.median(paired):.2f}×" if paired else "—"
        outputs = ok[engine][0]["outputs"]
        same = "—"
        if ref:
            pairs = list(zip(outputs, ref["outputs"], strict=False))
            same = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
        wall = statistics.median(r["wall_s"] for r in ok[engine])
        lines.append(
            f"| {ENGINES[engine]} | {len(outputs)} | {len(ok[engine])} | {wall:.1f} "
            f"| {statistics.median(rates):.1f} | {min(rates):.1f}–{max(rates):.1f} | {ratio} "
            f"| {same} | {loads} |"
        )
    return lines


def floors_table(runs: dict[str, dict[str, Any]], workload: Workload) -> list[str]:
    total_tokens = workload.prompt_tokens + len(workload.prompts) * workload.max_tokens
    output_tokens = len(workload.prompts) * workload.max_tokens
    lines = [
        "| dtype | copy GB/s | bytes read per decode step | bandwidth floor ms "
        "| kvserve decode step ms | step ÷ floor | matmul GFLOP/s | compute floor s "
        "| kvserve wall ÷ compute floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for dtype, run in runs.items():
        ckpt: Checkpoint = run["checkpoint"]
        bw_floor_ms = ckpt.decode_weight_bytes / (run["bandwidth_gbs"] * 1e9) * 1000
        flops = 2 * (ckpt.layer_linear_params * total_tokens + ckpt.lm_head_params * output_tokens)
        compute_floor_s = flops / (run["gflops"] * 1e9)
        kv_rounds = [r for r in run["results"].get("kvserve", []) if "wall_s" in r]
        steps = [r["decode_step_ms"] for r in kv_rounds]
        step = statistics.median(steps) if steps else None
        wall = statistics.median(r["wall_s"] for r in kv_rounds) if kv_rounds else None
        step_text = f"{step:.2f}" if step else "—"
        step_ratio = f"{step / bw_floor_ms:.2f}" if step else "—"
        wall_ratio = f"{wall / compute_floor_s:.2f}" if wall else "—"
        lines.append(
            f"| {dtype} | {run['bandwidth_gbs']:.1f} | {ckpt.decode_weight_bytes / 1e6:.0f} MB "
            f"| {bw_floor_ms:.2f} | {step_text} | {step_ratio} | {run['gflops']:.0f} "
            f"| {compute_floor_s:.1f} | {wall_ratio} |"
        )
    return lines


def report(
    args: argparse.Namespace,
    workload: Workload,
    runs: dict[str, dict[str, Any]],
    started: str,
    load_before: str,
) -> str:
    vllm_version = next(
        (
            result["version"]
            for run in runs.values()
            for result in run["results"].get("vllm", [])
            if "version" in result
        ),
        None,
    )
    ckpt = next(iter(runs.values()))["checkpoint"]
    lines = [
        f"# Throughput: kvserve and its peers ({started})",
        "",
        f"Command: `python benchmarks/throughput.py {' '.join(sys.argv[1:])}`",
        "",
        f"Machine: {describe()}.",
        f"Load average (1, 5, 15 min) before: {load_before}; after: {load_average()}"
        " (the machine is shared: other load slows every engine; 'load after' is the 1-min"
        " load average when each engine's run ended).",
        f"vLLM: {vllm_version or 'not run'}"
        + (f", VLLM_CPU_OMP_THREADS_BIND={args.vllm_threads_bind}" if vllm_version else "")
        + ".",
        "",
        f"Workload: {len(workload.prompts)} requests, prompt lengths {args.min_prompt}–"
        f"{args.max_prompt} (seed {args.seed}; {workload.prompt_tokens} prompt tokens), "
        f"{workload.max_tokens} output tokens each, greedy, EOS ignored, prefix caching off; "
        f"random {args.shape} (checkpoint.py), {ckpt.num_params / 1e6:.1f}M parameters. "
        "Static batches: "
        f"{args.batch_size} requests in arrival order. Wall time after a short warm-up. "
        f"Rounds: {args.rounds}, each engine once a round in the order of the table; medians "
        "over rounds, and the ratio as the median of each round's own ratio.",
        "",
    ]
    for dtype, run in runs.items():
        lines += [*engine_table(dtype, run), ""]
    lines += [
        "Floors. Bandwidth floor: bytes of every weight but the input embedding ÷ measured copy "
        "bandwidth (bytes read + written per second, copying 1 GiB). Compute floor: the "
        "linear layers' products, 2 · (the decoder layers' linear weights · (prompt + output "
        "tokens) + the output projection's weights · output tokens), ÷ the matmul rate "
        "measured through kvserve's own linear layer (2048² products); attention and every "
        "other op come on top.",
        "",
        *floors_table(runs, workload),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = load_average()
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    runs: dict[str, dict[str, Any]] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def publish() -> None:
        args.out.write_text(report(args, workload, runs, started, load_before))

    with tempfile.TemporaryDirectory(prefix="kvserve-bench-") as tmp:
        specs = {}
        for dtype in args.dtype:
            (Path(tmp) / dtype).mkdir()
            runs[dtype], specs[dtype] = prepare_dtype(dtype, workload, args, Path(tmp))
        # Round by round, engine by engine (in --engines order), each in every dtype: a
        # run cut short keeps the first engines' results in both dtypes.
        for _ in range(args.rounds):
            for engine in args.engines:
                for dtype in args.dtype:
                    result = run_one(engine, dtype, specs[dtype], args, Path(tmp))
                    runs[dtype]["results"].setdefault(engine, []).append(result)
                    publish()
    print(args.out.read_text())
    print(f"written to {args.out} at {time.strftime('%H:%M:%S')}", file=sys.stderr)


if __name__ == "__main__":
    main()
