"""gpt-oss's expert tensors, every expert stacked in one tensor, → one rank's part of
``FusedMoE``'s parameters (its features ``[start, start + n)`` of the intermediate size I).

Dense (``layout="stacked"``): ``gate_up_proj [E, H, 2I]`` with gate and up interleaved
along the last dimension (gate ``[..., ::2]``, up ``[..., 1::2]``) and ``gate_up_proj_bias
[E, 2I]`` alike, ``down_proj [E, I, H]``, ``down_proj_bias [E, H]`` → ``w13 [E, 2n, H]``
(gate rows, then up rows), ``w13_bias [E, 2n]``, ``w2 [E, H, n]``, ``w2_bias [E, H]``
(rank 0's; zeros on the others, so that the all-reduce adds it once).

MXFP4 (``layout="mxfp4"``, ``kernels.mxfp4``'s layout, rows of ``[N, K]``):
``gate_up_proj_blocks [E, 2I, H/32, 16]`` and ``_scales [E, 2I, H/32]``, rows interleaved
→ ``w13_blocks [E, 2n, H/32, 16]``, ``w13_scales [E, 2n, H/32]`` (gate rows, then up rows);
``down_proj_blocks [E, H, I/32, 16]`` and ``_scales [E, H, I/32]`` → ``w2_blocks [E, H,
n/32, 16]``, ``w2_scales [E, H, n/32]``: a rank's n features are whole groups of 32.
"""

from typing import Any

import torch

from kvserve.engine.kernels.mxfp4 import MXFP4_BLOCK
from kvserve.engine.layers.linear import read, shape_of
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.quantization.config import Mxfp4Scheme, QuantConfig

MXFP4_PARAMS = ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales")


def stacked_layout(quant: QuantConfig | None) -> str:
    """``FusedMoE``'s layout for a checkpoint of stacked experts quantized as ``quant``."""
    return "mxfp4" if quant is not None and isinstance(quant.scheme, Mxfp4Scheme) else "stacked"


def stacked_shapes(experts: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of the dense tensors, by the parameter each fills."""
    return {
        "w13": (experts, hidden, 2 * inter),
        "w13_bias": (experts, 2 * inter),
        "w2": (experts, inter, hidden),
        "w2_bias": (experts, hidden),
    }


def mxfp4_shapes(experts: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    """The shapes of the MXFP4 tensors for ``inter`` features, by the parameter each fills."""
    groups_h, groups_i = hidden // MXFP4_BLOCK, inter // MXFP4_BLOCK
    return {
        "w13_blocks": (experts, 2 * inter, groups_h, 16),
        "w13_scales": (experts, 2 * inter, groups_h),
        "w2_blocks": (experts, hidden, groups_i, 16),
        "w2_scales": (experts, hidden, groups_i),
    }


def rank_part(
    name: str, loaded: Any, tp: TensorParallel, n: int, shape: tuple[int, int, int]
) -> torch.Tensor:
    """This rank's part (``n`` features) of the tensor ``loaded`` that fills parameter
    ``name``; ``shape``: (experts, hidden size, intermediate size) of the whole layer."""
    full = {**stacked_shapes(*shape), **mxfp4_shapes(*shape)}[name]
    rank = tp.rank
    if shape_of(loaded) != full:
        raise ValueError(
            f"the experts' {name} must have shape {list(full)} (num_local_experts, "
            f"hidden_size, intermediate_size as stacked), not {list(shape_of(loaded))}"
        )
    start = rank * n
    if name == "w2_bias":
        return read(loaded) if rank == 0 else torch.zeros(full)
    if name == "w2":
        return read(loaded, 1, start, n).transpose(1, 2)
    if name.startswith("w2_"):  # MXFP4 down: whole groups of the intermediate features
        return read(loaded, 2, start // MXFP4_BLOCK, n // MXFP4_BLOCK)
    rows = read(loaded)
    if name in ("w13", "w13_bias"):  # gate/up interleaved along the last dimension
        gate, up = rows[..., 0::2], rows[..., 1::2]
        both = torch.cat([gate[..., start : start + n], up[..., start : start + n]], -1)
        return both.transpose(1, 2) if name == "w13" else both
    gate, up = rows[:, 0::2], rows[:, 1::2]  # MXFP4 gate/up: interleaved rows
    return torch.cat([gate[:, start : start + n], up[:, start : start + n]], 1)
