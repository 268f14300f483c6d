"""``ModelRunner.prepare``'s time per decode step at batch 1, 16, 64 and 256, this tree
against another checkout, in one run.

    python benchmarks/input_batch_cpu.py --baseline /tmp/base [--rounds 5]

Per batch size B: B requests of 512 prompt tokens each (tests/checkpoints.py's tiny Llama,
float32, CPU, one torch thread, max_num_seqs B) are prefilled, then ``--steps`` decode steps
run through ``LLMEngine.step`` (synchronous scheduling) with ``runner.prepare`` timed; each
step's whole time is taken too. A tree's figure is the median over its steps. ``--baseline
PATH`` measures the same on another checkout of kvserve (e.g. ``git worktree add /tmp/base
main``) in a fresh interpreter; the trees take turns, ``--rounds`` times (which one goes
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


def measure(batches: tuple[int, ...], steps: int) -> dict[str, dict[str, float]]:
    """Median µs per decode step of ``prepare`` and of the whole step, by batch size, for
    the kvserve importable here."""
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
            params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
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
            whole = []
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                whole.append(time.perf_counter() - start)
            results[str(batch)] = {
                "prepare": statistics.median(prepared) * 1e6,
                "step": statistics.median(whole) * 1e6,
            }
    return results


def measure_tree(tree: Path, batches: tuple[int, ...], steps: int) -> dict:
    """``measure`` with ``kvserve`` imported from ``tree``, in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kvserve").symlink_to(tree.resolve())
        env = os.environ | {"PYTHONPATH": tmp, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(Path(__file__).resolve()), "--json", "--steps", str(steps)]
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
    parser.add_argument("--json", action="store_true", help="print this tree's times as JSON")
    args = parser.parse_args()
    batches = tuple(args.batches)
    if args.json:
        print(json.dumps(measure(batches, args.steps)))
        return
    trees = {"this tree": HERE.parent}
    if args.baseline is not None:
        trees = {"baseline": args.baseline} | trees
    load_before = Path("/proc/loadavg").read_text().strip()
    rounds: dict[str, list[dict]] = {label: [] for label in trees}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for label, tree in order:
            rounds[label].append(measure_tree(tree, batches, args.steps))
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"/proc/loadavg before: {load_before}; after: {load_after}")
    print(f"{args.rounds} rounds, {args.steps} decode steps each, prompts of {PROMPT} tokens")
    print("| batch | tree | prepare µs/step | whole step µs | prepare: baseline ÷ this tree |")
    print("| --- | --- | --- | --- | --- |")
    for batch in map(str, batches):
        ratio = "–"
        if args.baseline is not None:
            ratios = [
                base[batch]["prepare"] / this[batch]["prepare"]
                for base, this in zip(rounds["baseline"], rounds["this tree"], strict=True)
            ]
            ratio = f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"
        for label, results in rounds.items():
            prepare = statistics.median(r[batch]["prepare"] for r in results)
            step = statistics.median(r[batch]["step"] for r in results)
            shown = ratio if label == "this tree" else ""
            print(f"| {batch} | {label} | {prepare:.0f} | {step:.0f} | {shown} |")


if __name__ == "__main__":
    main()
