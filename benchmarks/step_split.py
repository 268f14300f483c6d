"""Where kvserve's offline wall time goes: W1 (throughput.py's workload) run once, timed by
step phase and, with --kernels, by C kernel.

    python benchmarks/step_split.py [--dtype bf16] [--kernels] [--prefix-caching]
                                    [--shape S | --model DIR] [--quick]

Phases: the scheduler's `schedule` and `update`, the runner's input preparation, the model's
forward in prefill steps (a chunk longer than one token) and in decode-only steps, the LM
head, and sampling; "other" is the rest of `LLMEngine.step` (outputs, stop checks). With
--kernels every call of the project's C library is timed by kernel name; that needs eager
decode steps (a replayed recording calls the kernels without `cpu_library.run`), so the
engine runs with `enforce_eager` and its decode steps are slower than in a normal run.
With --prefix-caching the cache is on (W1's random prompts share no prefix, so every full
block is hashed and none is found) and its block hashing is a phase of its own.
Not a test: one run on a shared machine says where the time goes, not what it costs.
"""

import argparse
import collections
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpoint import SHAPES, build_checkpoint
from throughput import DTYPES, Workload

from kvserve import LLM, SamplingParams
from kvserve.engine.kernels import cpu_library


class Split:
    """Seconds and calls per name, from the wrapped callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def timed(self, fn: Callable[..., Any], name: Callable[..., str] | str) -> Callable[..., Any]:
        """``fn``, adding its wall time to ``name`` (or to what ``name(*args)`` says)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = name if isinstance(name, str) else name(*args)
                self.seconds[key] += time.perf_counter() - start
                self.calls[key] += 1

        return wrapper

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(llm: LLM, split: Split, kernels: bool) -> None:
    """Wrap ``llm``'s engine phases (and, with ``kernels``, the C library's calls)."""
    engine = llm.engine
    runner = engine.runner
    engine.kv.chain_hash = split.timed(engine.kv.chain_hash, "prefix-cache hashing")
    engine.scheduler.schedule = split.timed(engine.scheduler.schedule, "schedule")
    engine.scheduler.update = split.timed(engine.scheduler.update, "update")
    runner.prepare = split.timed(runner.prepare, "prepare inputs")
    runner.forward = split.timed(
        runner.forward,
        lambda ids, positions, caches, meta, rows: (
            "forward, decode steps" if meta.max_query_len == 1 else "forward, prefill steps"
        ),
    )
    runner.model.logits = split.timed(runner.model.logits, "LM head")
    engine.sampler = split.timed(engine.sampler, "sample")
    engine.step = split.timed(engine.step, "step")
    if kernels:
        cpu_library.run = split.timed(cpu_library.run, lambda kernel, *args: f"C {kernel}")


def table(split: Split, wall: float) -> list[str]:
    """The split as markdown rows: phases (with "other" for the rest of the steps), then the
    kernels, each with seconds, share of the wall time and calls."""
    lines = ["| part | seconds | share of wall | calls |", "| --- | ---: | ---: | ---: |"]
    phases = {k: v for k, v in split.seconds.items() if not k.startswith("C ") and k != "step"}
    steps = split.seconds.get("step", 0.0)
    rows = sorted(phases.items(), key=lambda kv: -kv[1])
    rows.append(("other (in steps)", steps - sum(phases.values())))
    rows.append(("outside steps", wall - steps))
    rows += sorted(
        ((k, v) for k, v in split.seconds.items() if k.startswith("C ")), key=lambda kv: -kv[1]
    )
    for name, seconds in rows:
        calls = split.calls.get(name, "")
        lines.append(f"| {name} | {seconds:.3f} | {100 * seconds / wall:.1f} % | {calls} |")
    return lines


def run(
    model: Path, dtype: str, workload: Workload, kernels: bool, prefix_caching: bool
) -> tuple[float, Split]:
    """One timed generate of ``workload`` after a warm-up; its wall seconds and split."""
    llm = LLM(
        model=str(model),
        dtype=dtype,
        enable_prefix_caching=prefix_caching,
        enforce_eager=kernels,
    )
    split = Split()
    instrument(llm, split, kernels)
    llm.generate([[5, 6, 7]] * 3, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    split.clear()
    params = SamplingParams(temperature=0.0, max_tokens=workload.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(workload.prompts, params)
    return time.perf_counter() - start, split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--kernels", action="store_true", help="time every C kernel call (eager)")
    p.add_argument("--prefix-caching", action="store_true", help="time the block hashing")
    p.add_argument("--model", type=Path, help="checkpoint (default: one built of --shape)")
    p.add_argument("--shape", choices=list(SHAPES), default="llama-134m", help="checkpoint.py's")
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    n, max_tokens = (8, 16) if args.quick else (64, 128)
    workload = Workload.random(n, 32, 512, max_tokens, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model = (
            args.model
            or build_checkpoint(Path(tmp) / "model", DTYPES[args.dtype], shape=args.shape).directory
        )
        wall, split = run(model, args.dtype, workload, args.kernels, args.prefix_caching)
    print(f"{args.dtype}: {wall:.2f} s, {n * max_tokens / wall:.1f} out tok/s")
    print("\n".join(table(split, wall)))


if __name__ == "__main__":
    main()
