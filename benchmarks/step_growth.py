"""Per-token work on the engine thread at token 100 and at token 3,900 of one generation.

    python benchmarks/step_growth.py --baseline /tmp/base [--tokens 4000]

One request (the tiny Llama of tests/checkpoints.py, max_position_embeddings 4,200, float32,
CPU) generates 4,000 tokens greedily with EOS ignored, one ``LLMEngine.step()`` per token,
each followed by the server's ``ServerMetrics.on_step`` (both run on the engine thread). Per
step these times are taken: the whole (step + metrics), the model forward
(``runner.execute``), the whole less the forward (scheduling, sampling, outputs, metrics) and
the output building alone (``LLMEngine._output``, the detokenizer included). Each is the
median over the 100 steps around token 100 and around token 3,900.
Two workloads: plain, and with logprobs=1 and a stop string that never matches (the
detokenizer then holds text back). ``--baseline PATH`` runs the same measurement on another
checkout of kvserve (e.g. ``git worktree add /tmp/base HEAD``) in a subprocess of the same
run, so both trees are measured on the same machine at the same time.
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
EARLY, LATE = 100, 3900  # the middle of each 100-step window (LATE: tokens - 100)
WORKLOADS = {"plain": {}, "logprobs + stop string": {"logprobs": 1, "stop": ("@@@@@@@@",)}}
PROMPT = list(range(5, 21))
COLUMNS = ("step", "forward", "rest", "output")


def measure(tokens: int) -> dict:
    """Times per workload and window, in microseconds, for the kvserve importable here."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import torch

    from kvserve.engine.config import EngineConfig
    from kvserve.engine.llm_engine import LLMEngine
    from kvserve.engine.sampling_params import SamplingParams
    from kvserve.server.metrics import ServerMetrics

    from checkpoints import build_checkpoint

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint("llama", Path(tmp) / "llama", max_position_embeddings=4200)
        config = EngineConfig(model=str(model), dtype="float32", num_kv_blocks=300)
        engine = LLMEngine(config)
        clock = {"forward": 0.0, "output": 0.0}

        def timed(name, fn):
            def run(*args):
                start = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    clock[name] += time.perf_counter() - start

            return run

        engine.runner.execute = timed("forward", engine.runner.execute)
        engine._output = timed("output", engine._output)
        metrics = ServerMetrics("bench")
        for name, extra in WORKLOADS.items():
            params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, **extra)
            engine.add_request(name, PROMPT, params)
            rows = []
            while engine.has_unfinished_requests():
                clock["forward"] = clock["output"] = 0.0
                start = time.perf_counter()
                metrics.on_step(engine.stats, engine.step())
                step = time.perf_counter() - start
                rows.append((step, clock["forward"], step - clock["forward"], clock["output"]))
            results[name] = {
                window: {
                    column: statistics.median(r[i] for r in rows[lo:hi]) * 1e6
                    for i, column in enumerate(COLUMNS)
                }
                for window, middle in (("early", EARLY), ("late", tokens - (4000 - LATE)))
                for lo, hi in [(middle - 50, middle + 50)]
            }
    return results


def measure_tree(tree: Path, tokens: int) -> dict:
    """``measure`` with ``kvserve`` imported from ``tree``, in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kvserve").symlink_to(tree.resolve())
        env = os.environ | {"PYTHONPATH": tmp, "OMP_NUM_THREADS": "1"}
        out = subprocess.run(
            [sys.executable, __file__, "--json", "--tokens", str(tokens)],
            env=env,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
    return json.loads(out.stdout.splitlines()[-1])


def table(label: str, results: dict) -> list[str]:
    lines = []
    for workload, windows in results.items():
        cells = []
        for column in COLUMNS:
            early, late = windows["early"][column], windows["late"][column]
            cells.append(f"{early:.0f} → {late:.0f} ({late / early:.2f}×)")
        lines.append(f"| {label} | {workload} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another kvserve checkout to compare")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--json", action="store_true", help="print this tree's times as JSON")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.tokens)))
        return
    load_before = Path("/proc/loadavg").read_text().strip()
    trees = {"after (this tree)": HERE.parent}
    if args.baseline is not None:
        trees = {f"before ({args.baseline})": args.baseline} | trees
    results = {label: measure_tree(tree, args.tokens) for label, tree in trees.items()}
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"/proc/loadavg before: {load_before}; after: {load_after}")
    late = args.tokens - (4000 - LATE)
    print(f"{args.tokens} tokens; median µs per step around token {EARLY} → around {late}")
    print("| tree | workload | step + metrics | model forward | all but the forward | outputs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, result in results.items():
        print("\n".join(table(label, result)))


if __name__ == "__main__":
    main()
