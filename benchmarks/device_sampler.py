"""A decode step's cost with penalties read from the device history (this checkout) against a
baseline checkout (penalties rebuilt from the host's token lists every step), on a CPU.

    python benchmarks/device_sampler.py --baseline-python /work/main/.venv/bin/python
        [--batches 16 64] [--steps 24] [--rounds 2] [--threads 1]

Each cell is one process of either checkout's Python (this file run with ``--worker``): an
engine (llama-134m in bf16, vocabulary 32000, synchronous steps) with ``batch`` requests of
32-token prompts, greedy, EOS ignored; after the prefill and 4 warm-up decode steps, the
median of ``--steps`` decode steps (``LLMEngine.step``) and of the sampler's share of them.
"with penalties": every request sets presence 0.5, frequency 0.5, repetition 1.1 and
``min_tokens`` to its whole output. The checkouts take turns (order swapped every round), so
the rounds' spread shows the machine's noise; the ratios are medians over rounds.

Then, in this process, the part that changed alone: the penalties and ``min_tokens`` ban of a
batch of penalised requests (32 outputs each) on float32 logits [batch, 32000], from the
host's token lists (``tests/penalty_reference.py``, the baseline's formula) and from the device
history (``Sampler.adjust_logits`` and ``StepRows.record``), taking turns call by call.
Not a test.
"""

import argparse
import json
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1)


def worker(model: str, batch: int, penalised: bool, steps: int) -> dict[str, float]:
    """Median ms of a decode step and of the sampler in it."""
    from kvserve import SamplingParams
    from kvserve.engine.config import EngineConfig
    from kvserve.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=model, dtype="bfloat16", max_model_len=512))
    total = steps + 6
    extra = dict(PENALTIES, min_tokens=total) if penalised else {}
    params = SamplingParams(temperature=0, max_tokens=total, ignore_eos=True, **extra)
    for i in range(batch):
        engine.add_request(str(i), [(7 * i + j) % 31000 + 2 for j in range(32)], params)
    sampler, sampling = engine.sampler, [0.0]

    def timed_sampler(*args, **kwargs):
        start = time.perf_counter()
        out = sampler(*args, **kwargs)
        sampling[0] += time.perf_counter() - start
        return out

    engine.sampler = timed_sampler  # type: ignore[assignment]
    while engine.stats.num_running < batch or engine.scheduler.waiting:
        engine.step()
    for _ in range(4):
        engine.step()
    step_ms, sample_ms = [], []
    for _ in range(steps):
        sampling[0] = 0.0
        start = time.perf_counter()
        engine.step()
        step_ms.append((time.perf_counter() - start) * 1e3)
        sample_ms.append(sampling[0] * 1e3)
    return {"step_ms": statistics.median(step_ms), "sample_ms": statistics.median(sample_ms)}


def adjustments(batch: int, calls: int) -> tuple[float, float]:
    """Median ms of the host-list adjustment and of the device history's (with its record)."""
    from penalty_reference import host_list_logits

    from kvserve import SamplingParams
    from kvserve.engine.core.request import Request
    from kvserve.engine.sampler import Sampler

    generator = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=64, min_tokens=64, **PENALTIES)
    requests = []
    for i in range(batch):
        ids = torch.randint(2, 32000, (64,), generator=generator).tolist()
        requests.append(Request(str(i), ids[:32], params))
        requests[-1].all_token_ids.extend(ids[32:])
    logits = torch.randn(batch, 32000, generator=generator)
    tokens = logits.argmax(dim=-1)
    sampler = Sampler((0,))
    rows = sampler.state.rows(requests)
    host, device = [], []
    for _ in range(calls):
        start = time.perf_counter()
        host_list_logits(logits, requests, (0,))
        middle = time.perf_counter()
        sampler.adjust_logits(logits, requests, rows)
        rows.record(logits, tokens)
        end = time.perf_counter()
        host.append((middle - start) * 1e3)
        device.append((end - middle) * 1e3)
    return statistics.median(host), statistics.median(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--baseline-python", help="the baseline checkout's python (required)")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--out", type=Path, default=HERE / "results" / "device-sampler-cpu.md")
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "BATCH", "PENALISED"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        model, batch, penalised = args.worker
        print(json.dumps(worker(model, int(batch), penalised == "1", args.steps)))
        return
    if args.baseline_python is None:
        p.error("--baseline-python is required")
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    pythons = {"baseline": args.baseline_python, "device history": sys.executable}
    cells: dict[tuple[str, int, bool], list[dict[str, float]]] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvserve-sampler-") as tmp:
        model = str(build_checkpoint(Path(tmp) / "model", torch.bfloat16).directory)
        for round_ in range(args.rounds):
            order = list(pythons) if round_ % 2 == 0 else list(reversed(pythons))
            for batch in args.batches:
                for penalised in (False, True):
                    for name in order:
                        command = [
                            pythons[name], __file__, "--worker", model, str(batch),
                            "1" if penalised else "0", "--steps", str(args.steps),
                            "--threads", str(args.threads),
                        ]  # fmt: skip
                        done = subprocess.run(command, check=True, capture_output=True, text=True)
                        cell = json.loads(done.stdout.strip().splitlines()[-1])
                        cells.setdefault((name, batch, penalised), []).append(cell)
                        rows.append(
                            f"| {round_ + 1} | {batch} | {'yes' if penalised else 'no'} | {name} "
                            f"| {cell['step_ms']:.1f} | {cell['sample_ms']:.2f} |"
                        )
                        print(rows[-1], file=sys.stderr, flush=True)
    alone = []
    for batch in args.batches:
        host_ms, device_ms = adjustments(batch, 40)
        alone.append(
            f"| {batch} | {host_ms:.2f} | {device_ms:.2f} | **{device_ms / host_ms:.2f}x** |"
        )
    summary = []
    for batch in args.batches:
        for penalised in (False, True):

            def median(name: str, key: str, batch=batch, penalised=penalised) -> float:
                return statistics.median(c[key] for c in cells[(name, batch, penalised)])

            step = median("device history", "step_ms") / median("baseline", "step_ms")
            sample = median("device history", "sample_ms") / median("baseline", "sample_ms")
            summary.append(
                f"| {batch} | {'yes' if penalised else 'no'} | {median('baseline', 'step_ms'):.1f} "
                f"| {median('device history', 'step_ms'):.1f} | **{step:.2f}x** "
                f"| {median('baseline', 'sample_ms'):.2f} "
                f"| {median('device history', 'sample_ms'):.2f} | {sample:.2f}x |"
            )
    lines = [
        f"# Sampling from the device history on a CPU ({started})",
        "",
        describe(),
        "",
        f"Command: `python benchmarks/device_sampler.py {' '.join(sys.argv[1:])}`",
        "",
        f"llama-134m in bf16 (vocabulary 32000), synchronous steps, {args.threads} torch "
        f"thread(s) per process, median of {args.steps} decode steps per cell, {args.rounds} "
        "rounds with the checkouts taking turns.",
        "",
        "| batch | penalties | baseline step ms | device history step ms | ratio "
        "| baseline sampler ms | device history sampler ms | ratio |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *summary,
        "",
        "The penalties and `min_tokens` ban alone, in one process, taking turns call by call "
        "(median ms of 40 calls):",
        "",
        "| batch | host lists (baseline formula) | device history | ratio |",
        "| ---: | ---: | ---: | ---: |",
        *alone,
        "",
        "Every cell:",
        "",
        "| round | batch | penalties | checkout | step ms | sampler ms |",
        "| ---: | ---: | --- | --- | ---: | ---: |",
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
