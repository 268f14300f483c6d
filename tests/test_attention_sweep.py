"""benchmarks/attention_sweep.py on the CPU: the grid it sweeps and how it ranks what ran
(the timing itself needs a GPU)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "attention_sweep", ROOT / "benchmarks" / "attention_sweep.py"
)
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def variant(block_n: int, splits: int, us: float | None, error: float = 0.001) -> dict:
    tile = dict(block_n=block_n, num_warps=2, num_stages=3, native_dots=True)
    if us is None:
        return tile | {"num_splits": splits, "error": "CompilationError: out of resources"}
    return tile | {"num_splits": splits, "us": us, "max_error": error}


def test_the_grid_is_every_combination_of_the_tile_choices():
    grid = sweep.tile_grid()
    assert len(grid) == 3 * 3 * 2 * 2
    assert len({tuple(tile.values()) for tile in grid}) == len(grid)
    assert {tile["block_n"] for tile in grid} == {16, 32, 64}
    assert grid[0] == dict(block_n=16, num_warps=2, num_stages=1, native_dots=False)


def test_ranking_drops_failed_and_inaccurate_variants_and_orders_by_time():
    found = {
        "default": {"us": 77.0, "max_error": 0.004},
        "variants": [
            variant(32, 1, 50.0),
            variant(64, 1, 30.0, error=0.5),  # fast and wrong: 0.5 > 2 * 0.004 + 0.01
            variant(16, 1, None),
            variant(64, 2, 40.0, error=0.018),  # 0.018 is within the bound
            variant(64, 1, 45.0),
        ],
    }
    assert [(v["block_n"], v["num_splits"]) for v in sweep.ranked(found)] == [
        (64, 2),
        (64, 1),
        (32, 1),
    ]
    assert [tile["block_n"] for tile in sweep.ranked_tiles(found)] == [64, 32]


def test_without_cuda_it_runs_nothing(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert sweep.main(["--out", str(out)]) == 2
    assert not out.exists()
    assert "no CUDA device here" in capsys.readouterr().err
