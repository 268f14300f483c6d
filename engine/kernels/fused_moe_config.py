"""Tile configs of the fused MoE GEMMs, kept as data: one JSON file per shape and device
under ``fused_moe_configs/``, written by ``benchmarks/fused_moe_sweep.py`` on that device.

A file is named ``config_file_name(E, H, I, weights, device)``, e.g.
``E=128,H=2048,I=768,weights=bfloat16,device=NVIDIA_H100_80GB_HBM3.json``, where ``I`` is
the intermediate size one rank holds and ``weights`` the experts' format (``bfloat16``,
``float16``, ``float32`` or ``mxfp4``). It maps token counts (as strings) to tiles::

    {"1": {"block_m": 16, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}, ...}

A batch takes the tile of the nearest token count listed. Without a file for the shape, the
tile is ``default_tile``'s.
"""

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "fused_moe_configs"
MIN_DOT = 16  # tl.dot's smallest tile side


@dataclass(frozen=True)
class MoeTile:
    """One launch's tiles (both GEMMs use it; ``block_m`` is also the routing's padding),
    warps and software-pipelining stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < MIN_DOT or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= {MIN_DOT}, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two up to 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be positive, got {self.num_stages}")

    def as_json(self) -> dict[str, int]:
        return asdict(self)


def default_tile(tokens: int, top_k: int, num_experts: int) -> MoeTile:
    """Few rows per expert (decode): 16-row blocks, so little of each block is padding.
    Many (prefill): 64-row blocks."""
    if tokens * top_k <= 4 * num_experts:
        return MoeTile(16, 64, 64, num_warps=4, num_stages=3)
    return MoeTile(64, 64, 64, num_warps=4, num_stages=3)


def config_file_name(
    num_experts: int, hidden: int, intermediate: int, weights: str, device: str
) -> str:
    device_name = device.replace(" ", "_").replace("/", "_")
    shape = f"E={num_experts},H={hidden},I={intermediate}"
    return f"{shape},weights={weights},device={device_name}.json"


def read_tiles(path: Path) -> dict[int, MoeTile]:
    """A config file → token count → tile; ``ValueError`` naming the file if it is not one."""
    try:
        raw = json.loads(path.read_text())
        return {int(tokens): MoeTile(**tile) for tokens, tile in raw.items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not a fused MoE config file: {error}") from error


def write_tiles(path: Path, tiles: dict[int, MoeTile]) -> None:
    ordered = {str(tokens): tiles[tokens].as_json() for tokens in sorted(tiles)}
    path.write_text(json.dumps(ordered, indent=2) + "\n")


@lru_cache(maxsize=64)
def _tiles_for(path: Path) -> dict[int, MoeTile] | None:
    return read_tiles(path) if path.is_file() else None


def pick_tile(
    tokens: int,
    top_k: int,
    num_experts: int,
    hidden: int,
    intermediate: int,
    weights: str,
    device: str,
    config_dir: Path = CONFIG_DIR,
) -> MoeTile:
    """The tile for a batch of ``tokens`` tokens: from the shape's file, the entry of the
    nearest token count (the smaller on a tie); without a file, ``default_tile``."""
    name = config_file_name(num_experts, hidden, intermediate, weights, device)
    tiles = _tiles_for(config_dir / name)
    if not tiles:
        return default_tile(tokens, top_k, num_experts)
    nearest = min(tiles, key=lambda listed: (abs(listed - tokens), listed))
    return tiles[nearest]
