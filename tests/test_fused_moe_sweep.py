"""benchmarks/fused_moe_sweep.py on the CPU: its whole loop under Triton's interpreter
(``--dry-run``: a tiny shape, a few tiles), the grid, the bytes it rates against, and how
it ranks what ran (the timing itself needs a GPU)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from kvserve.engine.kernels.fused_moe_config import MoeTile, pick_tile, read_tiles

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "fused_moe_sweep", ROOT / "benchmarks" / "fused_moe_sweep.py"
)
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU interpreter's")
def test_the_dry_run_sweeps_each_token_count_and_writes_the_fastest_accurate_tiles(tmp_path):
    assert sweep.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    shape = sweep.DRY_RUN_SHAPE
    written = tmp_path / "E=4,H=64,I=32,weights=mxfp4,device=cpu.json"
    tiles = read_tiles(written)
    report = json.loads((tmp_path / "sweep-report.json").read_text())
    assert set(tiles) == set(sweep.DRY_RUN_TOKENS) and report["device"] == "cpu"
    for tokens, tile in tiles.items():
        found = report["tokens"][str(tokens)]
        grid = sweep.tile_grid(sweep.DRY_RUN_GRID, tokens, shape)
        assert [MoeTile(**{k: v[k] for k in tile.as_json()}) for v in found["variants"]] == grid
        assert all(v["max_error"] <= sweep.ACCURACY for v in found["variants"])
        fastest = min(found["variants"], key=lambda v: v["us"])
        assert tile.as_json() == {key: fastest[key] for key in tile.as_json()}
        assert found["expert_bytes"] == sweep.expert_bytes(shape, found["experts_touched"])
        picked = pick_tile(tokens, 2, 4, 64, 32, "mxfp4", "cpu", config_dir=tmp_path)
        assert picked == tile
    assert [len(sweep.tile_grid(sweep.DRY_RUN_GRID, t, shape)) for t in (1, 24)] == [2, 2]


def test_the_grid_skips_row_blocks_past_twice_the_mean_rows_per_expert():
    qwen = sweep.SHAPES["qwen3-30b-a3b"]
    per_block_m = 3 * 3 * 2 * 3
    decode = sweep.tile_grid(sweep.GRID, 1, qwen)  # 8 rows over 128 experts
    assert {tile.block_m for tile in decode} == {16} and len(decode) == per_block_m
    assert {tile.block_m for tile in sweep.tile_grid(sweep.GRID, 256, qwen)} == {16, 32}
    prefill = sweep.tile_grid(sweep.GRID, 8192, qwen)
    assert len(prefill) == 4 * per_block_m and len(set(prefill)) == len(prefill)


def test_the_bytes_are_the_touched_experts_weights_and_biases():
    qwen, gpt_oss = sweep.SHAPES["qwen3-30b-a3b"], sweep.SHAPES["gpt-oss-20b"]
    assert sweep.expert_bytes(qwen, 8) == 8 * 3 * 2048 * 768 * 2  # bf16, no biases
    mxfp4 = 3 * 2880 * 2880 // 2 + 3 * 2880 * 2880 // 32  # nibbles and a scale byte per 32
    assert sweep.expert_bytes(gpt_oss, 4) == 4 * (mxfp4 + 2 * (2 * 2880 + 2880))


def test_ranking_drops_failed_and_inaccurate_variants_and_orders_by_time():
    found = {
        "variants": [
            {"block_m": 16, "us": 50.0, "max_error": 0.0},
            {"block_m": 32, "us": 30.0, "max_error": 0.5},  # fast and wrong
            {"block_m": 64, "error": "CompilationError: out of resources"},
            {"block_m": 128, "us": 40.0, "max_error": sweep.ACCURACY},
        ]
    }
    assert [v["block_m"] for v in sweep.ranked(found)] == [128, 16]


def test_without_cuda_it_runs_nothing_and_the_dry_run_needs_a_directory(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert sweep.main(["--out-dir", str(tmp_path)]) == 2
        assert "no CUDA device here" in capsys.readouterr().err
        assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        sweep.main(["--dry-run"])
    assert "--dry-run needs --out-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--tp", "5"])
    assert "--tp must divide the intermediate size 768" in capsys.readouterr().err
