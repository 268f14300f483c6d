"""Each tensor-parallel rank's peak resident memory against the model's size: a rank reads only
its shard of the safetensors files (memory-mapped slices), never the whole model.

    python benchmarks/rank_memory.py [--shape qwen2-0.5b] [--dtype fp32] [--sizes 1 2]

For each rank count, in a fresh process: load the engine (a fixed 64-block KV cache), run one
request, then read every rank's peak RSS (``VmHWM``: rank 0 is the engine's process, the others
its worker processes), before shutdown. The baseline is the same process without a model
(Python, torch and kvserve imported). Not a test.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from checkpoint import SHAPES, build_checkpoint
from throughput import DTYPES

RUN = """
import json, sys
from pathlib import Path

def peak_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

from kvserve import LLM, SamplingParams
import os
base = peak_kib(os.getpid())
size = int(sys.argv[2])
llm = LLM(sys.argv[1], dtype=sys.argv[3], num_kv_blocks=64, tensor_parallel_size=size)
llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4))
runner = llm.engine.runner
pids = [os.getpid()] + (list(runner.pids) if size > 1 else [])
print(json.dumps({"baseline_kib": base, "ranks_kib": [peak_kib(p) for p in pids]}))
llm.engine.shutdown()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES), default="qwen2-0.5b")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp) / "model", DTYPES[args.dtype], shape=args.shape)
        weights = sum(f.stat().st_size for f in ckpt.directory.glob("*.safetensors"))
        print(f"{args.shape} {args.dtype}: {ckpt.num_params / 1e6:.0f}M parameters, "
              f"{weights / 2**20:.0f} MiB of safetensors")  # fmt: skip
        print("| ranks | rank | peak RSS (MiB) | above the process without a model (MiB) |")
        print("| ---: | ---: | ---: | ---: |")
        for size in args.sizes:
            out = subprocess.run(
                [sys.executable, "-c", RUN, str(ckpt.directory), str(size), dtype],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            result = json.loads(out.stdout.strip().splitlines()[-1])
            base = result["baseline_kib"]
            for rank, peak in enumerate(result["ranks_kib"]):
                print(f"| {size} | {rank} | {peak / 1024:.0f} | {(peak - base) / 1024:.0f} |")


if __name__ == "__main__":
    main()
