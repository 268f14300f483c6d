"""The fused MoE's tile configs as data: a file per shape and device, the nearest token
count's tile, the default without a file, bad files and tiles named."""

import json

import pytest

from kvserve.engine.kernels.fused_moe_config import (
    MoeTile,
    config_file_name,
    default_tile,
    pick_tile,
    read_tiles,
    write_tiles,
)

SHAPE = dict(top_k=8, num_experts=128, hidden=2048, intermediate=768, weights="bfloat16")
DEVICE = "NVIDIA H100 80GB HBM3"


def test_the_file_name_holds_the_shape_the_format_and_the_device():
    name = config_file_name(128, 2048, 768, "bfloat16", DEVICE)
    assert name == "E=128,H=2048,I=768,weights=bfloat16,device=NVIDIA_H100_80GB_HBM3.json"


def test_a_batch_takes_the_tile_of_the_nearest_token_count_listed(tmp_path):
    tiles = {
        1: MoeTile(16, 32, 64),
        16: MoeTile(16, 64, 64, num_warps=8),
        64: MoeTile(32, 64, 128, num_stages=4),
        1024: MoeTile(128, 128, 64, num_warps=8, num_stages=2),
    }
    write_tiles(tmp_path / config_file_name(128, 2048, 768, "bfloat16", DEVICE), tiles)
    picked = {
        tokens: pick_tile(tokens, device=DEVICE, config_dir=tmp_path, **SHAPE)
        for tokens in (1, 8, 9, 40, 41, 100, 5000)
    }
    assert picked == {
        1: tiles[1],
        8: tiles[1],  # 7 from 1, 8 from 16
        9: tiles[16],
        40: tiles[16],  # a tie between 16 and 64: the smaller
        41: tiles[64],
        100: tiles[64],
        5000: tiles[1024],
    }


def test_without_a_file_for_the_shape_the_default_tile(tmp_path):
    write_tiles(
        tmp_path / config_file_name(128, 2048, 768, "mxfp4", DEVICE), {1: MoeTile(32, 32, 32)}
    )
    for tokens in (1, 64, 65, 4096):
        expected = default_tile(tokens, 8, 128)
        assert pick_tile(tokens, device=DEVICE, config_dir=tmp_path, **SHAPE) == expected
    assert default_tile(64, 8, 128).block_m == 16  # 512 slots over 128 experts: decode-like
    assert default_tile(65, 8, 128).block_m == 64


def test_files_round_trip_with_token_counts_as_keys(tmp_path):
    path = tmp_path / "tiles.json"
    write_tiles(path, {256: MoeTile(64, 64, 32), 2: MoeTile(16, 16, 16, 1, 1)})
    raw = json.loads(path.read_text())
    assert list(raw) == ["2", "256"]
    assert raw["2"] == dict(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1)
    assert read_tiles(path) == {2: MoeTile(16, 16, 16, 1, 1), 256: MoeTile(64, 64, 32)}


@pytest.mark.parametrize(
    "text",
    ['{"one": {"block_m": 16, "block_n": 16, "block_k": 16}}', '{"1": {"block_m": 16}}', "[1]"],
)
def test_a_bad_file_is_named(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.json is not a fused MoE config file"):
        read_tiles(path)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(block_m=8, block_n=16, block_k=16), "block_m"),
        (dict(block_m=16, block_n=48, block_k=16), "block_n"),
        (dict(block_m=16, block_n=16, block_k=0), "block_k"),
        (dict(block_m=16, block_n=16, block_k=16, num_warps=3), "num_warps"),
        (dict(block_m=16, block_n=16, block_k=16, num_stages=0), "num_stages"),
    ],
)
def test_bad_tiles_are_named(fields, named):
    with pytest.raises(ValueError, match=f"^{named} must be"):
        MoeTile(**fields)
