"""Quantized checkpoints on a CPU: an FP8 (compressed-tensors, per-channel weights, dynamic
activations) and a 4-bit AWQ (groups of 128) checkpoint of the same random model against its
bf16 checkpoint, W1's workload and the peak memory of each, one after another in one run.

    python benchmarks/quantized_cpu.py [--shape llama-134m qwen2-0.5b] [--quick]

The quantized checkpoints are written by the tests' writers (tests/quant_checkpoints.py), in
their real on-disk formats. On a CPU kvserve dequantizes them into bf16 as they load (no
FP8 or 4-bit kernel of ours beats the packed bf16 ones here), so the expected ratios are
about 1: the files are smaller, the serving memory and speed are the bf16 model's. Not a
test.
"""

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checkpoint import SHAPES
from machine import describe
from throughput import Workload, parse_args, prepare_dtype, run_one

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from quant_checkpoints import write_quantized

HERE = Path(__file__).resolve().parent
FORMATS = {
    "bf16": None,
    "fp8 (compressed-tensors, per-channel, dynamic)": (
        "compressed-tensors-fp8",
        {"per_channel": True, "dynamic": True},
    ),
    "awq int4 (groups of 128)": ("awq", {"group_size": 128}),
}


def size_mib(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors")) / 2**20


def run_shape(shape: str, args: argparse.Namespace, tmp: Path) -> list[str]:
    args.shape = shape
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    (tmp / "bf16").mkdir(exist_ok=True)
    _, spec = prepare_dtype("bf16", workload, args, tmp)
    source = Path(spec["model"])
    rows = []
    base: dict[str, Any] | None = None
    for name, quant in FORMATS.items():
        model = source
        if quant is not None:
            fmt, options = quant
            model = write_quantized(source, tmp / f"{shape}-{fmt}", fmt, **options).path
        result = run_one("kvserve", "bf16", spec | {"model": str(model)}, args, tmp)
        rate = result["output_tokens"] / result["wall_s"]
        base = base or {"rate": rate, "rss": result["peak_rss_mib"]}
        rows.append(
            f"| {shape} | {name} | {size_mib(model):.0f} | {result['peak_rss_mib']:.0f} "
            f"({result['peak_rss_mib'] / base['rss']:.2f}x) | {result['wall_s']:.1f} | "
            f"{rate:.1f} ({rate / base['rate']:.2f}x) | {result['decode_step_ms']:.1f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--out", type=Path, default=HERE / "results" / "quantized-cpu.md")
    mine = p.parse_args()
    args = parse_args(["--engines", "kvserve", "--dtype", "bf16"] + (["--quick"] * mine.quick))
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Quantized checkpoints on a CPU ({started})",
        "",
        describe(),
        "",
        f"W1: {args.requests} requests, prompts of {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.max_tokens} output tokens each, compute dtype bf16, one run each, in this order.",
        "",
        "| model | checkpoint | safetensors (MiB) | peak RSS, MiB (vs bf16) | W1 wall (s) | "
        "output tok/s (vs bf16) | decode step, one stream (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory(prefix="kvserve-quant-") as tmp:
        for shape in mine.shape:
            lines += run_shape(shape, args, Path(tmp))
    mine.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
