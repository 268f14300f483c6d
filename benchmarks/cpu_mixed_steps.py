"""Would recorded CPU steps (``engine/graphs/cpu_graphs.py``) help mixed steps too? One
process, the benchmark model (``llama-134m``, float32), rounds taking turns:

- a decode step of --decodes sequences replayed from its recording and run eagerly: the
  difference is the Python a recording saves in a step of that many sequences;
- a step of those decodes carrying a fresh --chunks prompt, eagerly (no recording takes a
  step with a prefill chunk): what that saving would be a share of.

    python benchmarks/cpu_mixed_steps.py [--decodes 6] [--chunks 32 128 512] [--rounds 3]
        [--threads N] [--out FILE]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from checkpoint import build_checkpoint
from gpu_check import measure_decode, measure_mixed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--decodes", type=int, default=6)
    p.add_argument("--chunks", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, help="torch's threads (default: torch's own)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvserve.engine.config import EngineConfig
    from kvserve.engine.graphs.cpu_graphs import CPUDecodeGraphs
    from kvserve.engine.llm_engine import LLMEngine

    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(Path(tmp), torch.float32)
        engine = LLMEngine(
            EngineConfig(
                model=tmp, dtype="float32", device="cpu", num_kv_blocks=512,
                enable_prefix_caching=False,
            )
        )  # fmt: skip
        runner = engine.runner
        assert isinstance(runner.forward, CPUDecodeGraphs)
        recorded = runner.forward
        found: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, forward in (("decode_recorded_ms", recorded), ("decode_eager_ms", None)):
                runner.forward = forward or runner.model
                step = measure_decode(engine, args.decodes, 64, args.steps, seed=0)
                found.setdefault(name, []).append(step["step_ms"])
            runner.forward = recorded
            for chunk in args.chunks:
                mixed = measure_mixed(engine, args.decodes, chunk, args.steps, seed=0)
                found.setdefault(f"mixed_{chunk}_ms", []).append(mixed["eager_step_ms"])
    medians = {name: statistics.median(times) for name, times in found.items()}
    saved = medians["decode_eager_ms"] - medians["decode_recorded_ms"]
    result = {
        "threads": torch.get_num_threads(),
        "decodes": args.decodes,
        "medians_ms": medians,
        "recording_saves_ms": saved,
        "saved_share_of_mixed": {
            chunk: saved / medians[f"mixed_{chunk}_ms"] for chunk in args.chunks
        },
        "rounds": found,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
