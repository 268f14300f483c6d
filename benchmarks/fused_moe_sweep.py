"""The fused MoE's tile configs, swept on a GPU at one model's MoE shape; writes the tuned
config file that ``engine/kernels/fused_moe_config.py`` reads.

    python benchmarks/fused_moe_sweep.py [--shape qwen3-30b-a3b|gpt-oss-20b] [--tp N]
        [--weights bfloat16|mxfp4] [--tokens 1,8,...] [--budget-s 900] [--out-dir DIR]
    python benchmarks/fused_moe_sweep.py --dry-run --out-dir DIR

Needs a CUDA device (``--dry-run`` excepted). For each token count (decode, then prefill) it
times ``fused_moe`` under every tile of the grid (block sides, warps, pipelining stages; row
blocks larger than twice the mean rows per expert skipped), tokens routed at random to
distinct experts, the L2 cache flushed before each call. Each variant reports its time, the
bytes of the experts its routing touches over that time (GB/s), and the floor those bytes
set at the copy bandwidth measured in this run; a variant whose output differs from the
default tile's by more than ``ACCURACY`` of its largest element is dropped. The fastest tile
per token count goes to ``--out-dir``'s file for the shape and device. Stops once
``--budget-s`` has passed and writes what it has.

``--dry-run`` runs the same loop on the CPU under Triton's interpreter, at a tiny shape and
a few tiles (the times mean nothing): what tests/test_fused_moe_sweep.py checks.
"""

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from itertools import product
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class MoeShape:
    """One model's MoE layer as the kernel sees it on one rank."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    weights: str  # "bfloat16" or "mxfp4"
    activation: str
    biases: bool


SHAPES = {
    "qwen3-30b-a3b": MoeShape(128, 8, 2048, 768, "bfloat16", "silu", biases=False),
    "gpt-oss-20b": MoeShape(32, 4, 2880, 2880, "mxfp4", "swigluoai", biases=True),
}
DRY_RUN_SHAPE = MoeShape(4, 2, 64, 32, "mxfp4", "swigluoai", biases=True)
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_TOKENS = (512, 1024, 2048, 4096, 8192)
DRY_RUN_TOKENS = (1, 24)
GRID = dict(
    block_m=(16, 32, 64, 128),
    block_n=(32, 64, 128),
    block_k=(32, 64, 128),
    num_warps=(4, 8),
    num_stages=(2, 3, 4),
)
DRY_RUN_GRID = dict(
    block_m=(16, 32), block_n=(16, 32), block_k=(32,), num_warps=(4,), num_stages=(1,)
)
ACCURACY = 2**-5  # of the default tile's largest |output|: a few bf16 roundings apart
L2_FLUSH_BYTES = 256 * 2**20
REPEATS = 20


def tile_grid(grid: dict, tokens: int, shape: MoeShape):
    """Every combination of ``grid``'s choices as a ``MoeTile``, less the row blocks above
    ``max(16, 2 * mean rows per expert)``: mostly padding."""
    from kvserve.engine.kernels.fused_moe_config import MoeTile

    largest = max(16, 2 * tokens * shape.top_k / shape.experts)
    tiles = [MoeTile(**dict(zip(grid, values, strict=True))) for values in product(*grid.values())]
    return [tile for tile in tiles if tile.block_m <= largest]


def expert_bytes(shape: MoeShape, experts_touched: int) -> int:
    """Bytes of the experts a batch reads: ``w13`` and ``w2`` (MXFP4: half a byte a weight
    and a scale byte per 32) and their biases (bf16)."""
    weights = 3 * shape.hidden * shape.intermediate
    per_expert = weights * 2 if shape.weights != "mxfp4" else weights // 2 + weights // 32
    if shape.biases:
        per_expert += 2 * (2 * shape.intermediate + shape.hidden)
    return experts_touched * per_expert


def make_inputs(shape: MoeShape, tokens: int, device: torch.device, seed: int) -> dict:
    """bf16 activations and biases, random weights of the shape's format, each token routed
    to ``top_k`` distinct experts at random with softmax weights."""
    from kvserve.engine.kernels.mxfp4 import Mxfp4Weight

    generator = torch.Generator(device).manual_seed(seed)
    e, h, i = shape.experts, shape.hidden, shape.intermediate

    def dense(*size, scale):
        return (scale * torch.randn(*size, generator=generator, device=device)).bfloat16()

    def weight(rows, features):
        if shape.weights != "mxfp4":
            return dense(e, rows, features, scale=features**-0.5)
        groups = features // 32
        blocks = torch.randint(0, 256, (e, rows, groups, 16), generator=generator, device=device)
        scales = torch.randint(118, 122, (e, rows, groups), generator=generator, device=device)
        return Mxfp4Weight(blocks.to(torch.uint8), scales.to(torch.uint8))

    scores = torch.rand(tokens, e, generator=generator, device=device)
    top_scores, topk_ids = scores.topk(shape.top_k, dim=1)
    return dict(
        hidden=dense(tokens, h, scale=1.0),
        w13=weight(2 * i, h),
        w2=weight(h, i),
        topk_weights=top_scores.softmax(dim=1),
        topk_ids=topk_ids.to(torch.int32),
        activation=shape.activation,
        w13_bias=dense(e, 2 * i, scale=0.1) if shape.biases else None,
        w2_bias=dense(e, h, scale=0.1) if shape.biases else None,
    )


def time_us(run, device: torch.device) -> float:
    """Median microseconds of ``run()`` after a warm-up, the L2 cache flushed before each
    call; on the CPU (dry run) one call's wall time."""
    run()
    if device.type != "cuda":
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e6
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    times = []
    for _ in range(REPEATS):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def sweep_tokens(
    shape: MoeShape,
    tokens: int,
    grid: dict,
    device: torch.device,
    bandwidth_gbs: float | None,
    deadline: float,
) -> dict:
    """The default tile and each of the grid's, timed at ``tokens`` tokens; each variant's
    time, GB/s over the experts touched, and largest difference from the default's output
    (relative to its largest element)."""
    from kvserve.engine.kernels.fused_moe_config import default_tile
    from kvserve.engine.kernels.triton_fused_moe import fused_moe

    inputs = make_inputs(shape, tokens, device, seed=tokens)
    touched = int(inputs["topk_ids"].unique().numel())
    nbytes = expert_bytes(shape, touched)
    default = default_tile(tokens, shape.top_k, shape.experts)
    expected = fused_moe(**inputs, tile=default).float()
    scale = expected.abs().max().item() or 1.0

    def timed(tile) -> dict:
        try:
            out = fused_moe(**inputs, tile=tile)
            us = time_us(lambda: fused_moe(**inputs, tile=tile), device)
        except Exception as error:  # a tile the compiler refuses is a result too
            return tile.as_json() | {"error": f"{type(error).__name__}: {error}"[:300]}
        difference = (out.float() - expected).abs().max().item() / scale
        return tile.as_json() | {"us": us, "gbs": nbytes / us / 1e3, "max_error": difference}

    floor_us = None if bandwidth_gbs is None else nbytes / bandwidth_gbs / 1e3
    found: dict = {"experts_touched": touched, "expert_bytes": nbytes, "floor_us": floor_us}
    found |= {"default": timed(default), "variants": []}
    for tile in tile_grid(grid, tokens, shape):
        if time.monotonic() > deadline:
            found["stopped"] = "budget"
            break
        found["variants"].append(timed(tile))
    return found


def ranked(found: dict) -> list[dict]:
    """The variants that ran within ``ACCURACY`` of the default tile, fastest first."""
    accurate = (v for v in found["variants"] if "us" in v and v["max_error"] <= ACCURACY)
    return sorted(accurate, key=lambda v: v["us"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    p.add_argument("--tp", type=int, default=1, help="ranks sharing the intermediate size")
    p.add_argument("--weights", choices=("bfloat16", "mxfp4"), help="default: the model's")
    p.add_argument("--tokens", help="comma-separated token counts (default: decode, prefill)")
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--out-dir", type=Path, help="default: engine/kernels/fused_moe_configs")
    p.add_argument(
        "--report", type=Path, help="default: benchmarks/results/fused-moe-*.json (dry run: DIR's)"
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shape, CPU interpreter")
    args = p.parse_args(argv)
    if args.dry_run and args.out_dir is None:
        p.error("--dry-run needs --out-dir (it must not overwrite the tuned files)")
    if args.tp < 1 or SHAPES[args.shape].intermediate % args.tp:
        p.error(f"--tp must divide the intermediate size {SHAPES[args.shape].intermediate}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel module is first imported
        shape, grid, device = DRY_RUN_SHAPE, DRY_RUN_GRID, torch.device("cpu")
        token_counts = DRY_RUN_TOKENS
        device_name, bandwidth = "cpu", None
    else:
        if not torch.cuda.is_available():
            print("fused_moe_sweep: no CUDA device here; nothing was run", file=sys.stderr)
            return 2
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_check import copy_bandwidth_gbs

        shape = SHAPES[args.shape]
        shape = replace(shape, intermediate=shape.intermediate // args.tp)
        shape = replace(shape, weights=args.weights or shape.weights)
        grid, device = GRID, torch.device("cuda")
        token_counts = DECODE_TOKENS + PREFILL_TOKENS
        device_name, bandwidth = torch.cuda.get_device_name(), copy_bandwidth_gbs(device)
    if args.tokens:
        token_counts = tuple(int(t) for t in args.tokens.split(","))
    from kvserve.engine.kernels.fused_moe_config import (
        CONFIG_DIR,
        MoeTile,
        config_file_name,
        write_tiles,
    )

    deadline = time.monotonic() + args.budget_s
    report: dict = {"device": device_name, "copy_gbs": bandwidth, "shape": asdict(shape)}
    report["tokens"] = {}
    best: dict[int, MoeTile] = {}
    for tokens in token_counts:
        found = sweep_tokens(shape, tokens, grid, device, bandwidth, deadline)
        report["tokens"][str(tokens)] = found
        fastest = ranked(found)
        if fastest:
            keys = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
            best[tokens] = MoeTile(**{key: fastest[0][key] for key in keys})
            floor = found["floor_us"]
            floor_text = "" if floor is None else f", floor {floor:.1f} us"
            print(
                f"{tokens} tokens: {fastest[0]['us']:.1f} us at {fastest[0]['gbs']:.0f} GB/s "
                f"({found['expert_bytes'] / 2**20:.1f} MiB of experts{floor_text}), "
                f"default {found['default'].get('us', math.nan):.1f} us; best {best[tokens]}",
                flush=True,
            )
        if "stopped" in found:
            break
    out_dir = args.out_dir or CONFIG_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    name = config_file_name(
        shape.experts, shape.hidden, shape.intermediate, shape.weights, device_name
    )
    write_tiles(out_dir / name, best)
    if args.report:
        report_path = args.report
    elif args.dry_run:
        report_path = out_dir / "sweep-report.json"
    else:
        report_path = ROOT / "benchmarks" / "results" / f"fused-moe-{args.shape}-tp{args.tp}.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out_dir / name} and {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
