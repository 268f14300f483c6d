"""Decode attention's launch choices, timed side by side on a GPU at Llama-3-8B's shapes.

    python benchmarks/attention_sweep.py [--out FILE] [--budget-s 240]

Needs a CUDA device. For each decode batch (sequences x context tokens) it replays
``paged_attention`` from a CUDA graph (``gpu_check.graph_us``) under launch variants that
differ from ``attention_launch``'s pick in key tile (``block_n``), warps, pipelining
stages, native-dtype dot operands and the number of key splits, and checks each
variant's output against the torch path in fp32. The full grid of tile
choices runs on the first batch; the other batches try the first batch's best few,
then the best two with every power of two of splits. Stops sweeping once --budget-s has
passed and writes what it has.
"""

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ROOT, decode_attention_batch, graph_us, llama3_8b_config

SHAPES = ((64, 528), (16, 528), (1, 528), (256, 528), (64, 2048), (1, 4096))
TILES = dict(
    block_n=(16, 32, 64),
    num_warps=(2, 4, 8),
    num_stages=(1, 3),
    native_dots=(False, True),
)
SPLITS = (1, 2, 4, 8, 16, 32)
CARRIED = 8  # tile choices the first batch hands to the others


def tile_grid() -> list[dict]:
    """Every combination of TILES, as ``AttentionLaunch`` field overrides."""
    return [dict(zip(TILES, values, strict=True)) for values in itertools.product(*TILES.values())]


def sweep_shape(batch: int, context: int, tiles: list[dict], deadline: float) -> dict:
    """Times the launch ``attention_launch`` picks, each tile choice at its split count,
    and the best two tile choices at every split count; each with its largest
    difference from the fp32 torch path."""
    from kvserve.engine.layers.attention.torch_backend import TorchAttention
    from kvserve.engine.layers.attention.triton_backend import attention_launch, paged_attention

    config = llama3_8b_config()
    device = torch.device("cuda")
    query, key_cache, value_cache, meta = decode_attention_batch(config, batch, context, device)
    expected = TorchAttention().attend(
        query.float(), key_cache.float(), value_cache.float(), meta, 0.1
    )
    default = attention_launch(
        batch,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        1,
        torch.bfloat16,
    )

    def timed(launch) -> dict:
        try:
            out = paged_attention(launch, query, key_cache, value_cache, meta, 0.1)
        except Exception as error:  # a tile choice the compiler refuses is a result too
            return {"error": f"{type(error).__name__}: {error}"[:300]}
        difference = (out.float() - expected).abs().max().item()
        run = partial(paged_attention, launch, query, key_cache, value_cache, meta, 0.1)
        return {"us": graph_us(run), "max_error": difference}

    found: dict = {"default": asdict(default) | timed(default), "variants": []}

    def trials():
        for tile in tiles:
            yield tile, default.num_splits
        for best in ranked_tiles(found)[:2]:  # ranked once the tiles above have run
            yield from ((best, splits) for splits in SPLITS if splits != default.num_splits)

    for tile, splits in trials():
        if time.monotonic() > deadline:
            found["stopped"] = "budget"
            break
        launch = replace(default, **tile, num_splits=splits)
        found["variants"].append(tile | {"num_splits": splits} | timed(launch))
    return found


def ranked(found: dict) -> list[dict]:
    """The variants that ran and came within twice the default's difference from the fp32
    path (plus 0.01), fastest first."""
    bound = 2 * found["default"]["max_error"] + 0.01
    accurate = (v for v in found["variants"] if "us" in v and v["max_error"] <= bound)
    return sorted(accurate, key=lambda v: v["us"])


def ranked_tiles(found: dict) -> list[dict]:
    """The tile choices of ``ranked(found)``, each once."""
    tiles: list[dict] = []
    for variant in ranked(found):
        tile = {key: variant[key] for key in TILES}
        if tile not in tiles:
            tiles.append(tile)
    return tiles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "attention-sweep.json"
    )
    p.add_argument("--budget-s", type=float, default=240.0)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_sweep: no CUDA device here; nothing was run", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget_s
    report: dict = {"device": torch.cuda.get_device_name(), "shapes": {}}
    tiles = tile_grid()
    for batch, context in SHAPES:
        found = sweep_shape(batch, context, tiles, deadline)
        report["shapes"][f"{batch}x{context}"] = found
        print(f"{batch}x{context}: default {found['default']['us']:.1f} us;", end=" ")
        print("best", json.dumps(ranked(found)[:3]), flush=True)
        if len(tiles) > CARRIED:
            tiles = ranked_tiles(found)[:CARRIED]
        if "stopped" in found:
            break
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
