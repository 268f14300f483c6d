"""``ModelRunner.prepare``'s time per decode step at batch 1, 16, 64 and 256, this tree
against another checkout, in one run.

    python benchmarks/input_batch_cpu.py --baseline /tmp/base [--rounds 5] [--sampled]

Per batch size B: B requests of 512 prompt tokens each (tests/checkpoints.py's tiny Llama,
float32, CPU, one torch thread, max_num_seqs B) are prefilled, then ``--steps`` decode steps
run through ``LLMEngine.step`` (synchronous scheduling) with ``runner.prepare`` and the
sampler's call timed; each step's whole time is taken too. Greedy, or with ``--sampled``
temperature 0.8, top-k 40, top-p 0.9 and min-p 0.05 (every filter of the sampler runs).
A tree's figure is the median over its steps. ``--baseline PATH`` measures the same on
another checkout of kvserve (e.g. ``git worktree add /tmp/base main``) in a fresh
interpreter; the trees take turns, ``--rounds`` times (which one goes
first alternates), and the table gives each tree's median over the rounds and the ratio
(baseline ÷ this tree) as the median of the rounds' own ratios.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
BATCHES = (1, 16, 64, 256)
PROMPT = 512


SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05}


def measure(batches: tuple[int, ...], steps: int, sampled: bool) -> dict[str, dict[str, float]]:
    """Median µs per decode step of ``prepare``, of the sampler and of the whole step, by
    batch size, for the kvserve importable here."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import torch

    from kvserve.engine.config import EngineConfig
    from kvserve.engine.llm_engine import LLMEngine
    from kvserve.engine.sampling_params import SamplingParams

    from checkpoints import build_checkpoint

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint("llama", Path(tmp) / "llama", max_position_embeddings=1024)
        for batch in batches:
            config = EngineConfig(
                model=str(model),
                dtype="float32",
                max_num_seqs=batch,
                max_num_batched_tokens=max(2048, batch * PROMPT),
                num_kv_blocks=batch * (PROMPT + steps + 32) // 16 + 1,
            )
            engine = LLMEngine(config)
            chosen = SAMPLED if sampled else {"temperature": 0}
            params = SamplingParams(max_tokens=steps + 2, ignore_eos=True, **chosen)
            for i in range(batch):
                prompt = [5 + (j * 7 + i) % 500 for j in range(PROMPT)]
                engine.add_request(str(i), prompt, params)
            engine.step()  # the prefill
            prepare, prepared = engine.runner.prepare, []

            def timed(out, prepare=prepare, prepared=prepared):
                start = time.perf_counter()
                inputs = prepare(out)
                prepared.append(time.perf_counter() - start)
                return inputs

            engine.runner.prepare = timed
            sampler, sampling = engine.sampler, []

            class TimedSampler:
                def __getattr__(self, name, sampler=sampler):
                    return getattr(sampler, name)

                def __call__(self, *args, sampler=sampler, sampling=sampling, **kwargs):
                    start = time.perf_counter()
                    out = sampler(*args, **kwargs)
                    sampling.append(time.perf_counter() - start)
                    return out

            engine.sampler = TimedSampler()  # type: ignore[assignment]
            whole = []
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                whole.append(time.perf_counter() - start)
            results[str(batch)] = {
                "prepare": statistics.median(prepared) * 1e6,
                "sample": statistics.median(sampling) * 1e6,
                "step": statistics.median(whole) * 1e6,
            }
    return results


def measure_tree(tree: Path, batches: tuple[int, ...], steps: int, sampled: bool) -> dict:
    """``measure`` with ``kvserve`` imported from ``tree``, in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kvserve").symlink_to(tree.resolve())
        env = os.environ | {"PYTHONPATH": tmp, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(Path(__file__).resolve()), "--json", "--steps", str(steps)]
        command += ["--sampled"] if sampled else []
        out = subprocess.run(
            [*command, "--batches", *map(str, batches)],
            env=env,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another kvserve checkout to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--sampled", action="store_true", help="sample (filters), not greedy")
    parser.add_argument("--json", action="store_true", help="print this tree's times as JSON")
    args = parser.parse_args()
    batches = tuple(args.batches)
    if args.json:
        print(json.dumps(measure(batches, args.steps, args.sampled)))
        return
    trees = {"this tree": HERE.parent}
    if args.baseline is not None:
        trees = {"baseline": args.baseline} | trees
    load_before = Path("/proc/loadavg").read_text().strip()
    rounds: dict[str, list[dict]] = {label: [] for label in trees}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for label, tree in order:
            rounds[label].append(measure_tree(tree, batches, args.steps, args.sampled))
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"/proc/loadavg before: {load_before}; after: {load_after}")
    mode = "sampled " + str(SAMPLED) if args.sampled else "greedy"
    print(f"{args.rounds} rounds, {args.steps} {mode} decode steps each, prompts of {PROMPT}")
    print(
        "| batch | tree | prepare µs/step | sampler µs/step | whole step µs "
        "| prepare: baseline ÷ this tree | sampler: baseline ÷ this tree |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in map(str, batches):
        shown = {"prepare": "–", "sample": "–"}
        if args.baseline is not None:
            for key in shown:
                ratios = [
                    base[batch][key] / this[batch][key]
                    for base, this in zip(rounds["baseline"], rounds["this tree"], strict=True)
                ]
                low, high = min(ratios), max(ratios)
                shown[key] = f"{statistics.median(ratios):.2f}× ({low:.2f}–{high:.2f})"
        for label, results in rounds.items():
            times = [
                statistics.median(r[batch][key] for r in results)
                for key in ("prepare", "sample", "step")
            ]
            ratios = " | ".join(shown.values()) if label == "this tree" else " | "
            print(f"| {batch} | {label} | {' | '.join(f'{t:.0f}' for t in times)} | {ratios} |")


if __name__ == "__main__":
    main()
