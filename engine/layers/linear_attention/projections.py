"""A Gated DeltaNet's input projections, in the two checkpoint layouts, each giving this
rank's ``(qkv, z, b, a)``: ``qkv`` ``[T, conv_dim / tp]`` as ``[q | k | v]`` of its heads
(the convolution's channel order), ``z`` ``[T, v_heads / tp, head_v_dim]``, ``b`` and ``a``
``[T, v_heads / tp]``.

Heads shard by key head: rank r holds key heads ``[r * Hk / tp, (r + 1) * Hk / tp)`` and
the value heads they serve (value head ``h`` reads key head ``h // (Hv / Hk)``), which are
also consecutive.

``checkpoint_parts`` maps each checkpoint tensor (its name under the layer) to the
parameter it fills and its shard id, for the model's loader.
"""

from typing import Any

import torch
from torch import nn

from kvserve.engine.layers.linear import (
    ColumnParallelLinear,
    LinearMethod,
    MergedColumnParallelLinear,
    dims_of,
    read,
    set_shard_ids,
)
from kvserve.engine.layers.linear_attention.config import GatedDeltaNetConfig
from kvserve.engine.layers.tensor_parallel import TensorParallel

Projected = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class SectionedColumnParallelLinear(MergedColumnParallelLinear):
    """A merged column-parallel projection whose parts may come from one checkpoint tensor
    of several sections: shard id ``(first, count)`` fills parts ``first .. first + count -
    1`` from consecutive sections of one tensor (Qwen3.5's ``in_proj_qkv``: q, k and v)."""

    def __init__(
        self,
        in_features: int,
        out_features: list[int],
        shard_ids: set[Any],
        tp: TensorParallel,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__(in_features, out_features, False, tp, method, "key/value heads")
        self.sections = out_features
        for param in self.parameters():
            set_shard_ids(param, shard_ids)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        first, count = shard_id
        dims = dims_of(param)
        offset = 0
        for part in range(first, first + count):
            rows = self.sections[part]
            if dims.output is None:
                section = loaded
            else:
                unit = dims.output_unit
                section = read(loaded, dims.output, offset // unit, rows // unit)
            super().weight_loader(param, section, part)
            offset += rows


class Qwen3NextProjections(nn.Module):
    """Qwen3-Next: ``in_proj_qkvz`` ``[Hk * (2 Dk + 2 G Dv), hidden]``, grouped by key head
    (each group ``[q | k | v of its G value heads | z of them]``) and ``in_proj_ba``
    ``[Hk * 2G, hidden]`` (each group ``[b of its G heads | a of them]``): groups are
    contiguous, so a plain column split shards both."""

    def __init__(
        self, cfg: GatedDeltaNetConfig, tp: TensorParallel, method: LinearMethod | None
    ) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.in_proj_qkvz = ColumnParallelLinear(
            cfg.hidden_size,
            cfg.num_k_heads * (2 * cfg.head_k_dim + 2 * cfg.group * cfg.head_v_dim),
            False,
            tp,
            method,
            "key heads",
        )
        self.in_proj_ba = ColumnParallelLinear(
            cfg.hidden_size, 2 * cfg.num_v_heads, False, tp, None, "key heads"
        )
        self.checkpoint_parts: dict[str, tuple[str, Any]] = {
            "in_proj_qkvz": ("in_proj_qkvz", None),
            "in_proj_ba": ("in_proj_ba", None),
        }

    def forward(self, hidden: torch.Tensor) -> Projected:
        cfg = self.cfg
        tokens, heads = hidden.shape[0], cfg.num_k_heads // self.tp.size
        grouped_v = cfg.group * cfg.head_v_dim
        q, k, v, z = (
            self.in_proj_qkvz(hidden)
            .view(tokens, heads, -1)
            .split([cfg.head_k_dim, cfg.head_k_dim, grouped_v, grouped_v], dim=-1)
        )
        b, a = self.in_proj_ba(hidden).view(tokens, heads, -1).split(cfg.group, dim=-1)
        qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=-1)
        return qkv, z.reshape(tokens, -1, cfg.head_v_dim), b.flatten(1), a.flatten(1)


class Qwen3_5Projections(nn.Module):
    """Qwen3.5: ``in_proj_qkv`` ``[2 key_dim + value_dim, hidden]`` (all q, all k, all v),
    ``in_proj_z`` ``[value_dim, hidden]``, ``in_proj_b`` and ``in_proj_a``
    ``[Hv, hidden]``: one matmul for q, k, v and z (each section split over the ranks) and
    one for b and a."""

    def __init__(
        self, cfg: GatedDeltaNetConfig, tp: TensorParallel, method: LinearMethod | None
    ) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp
        key_dim, value_dim = cfg.num_k_heads * cfg.head_k_dim, cfg.num_v_heads * cfg.head_v_dim
        self.in_proj_qkvz = SectionedColumnParallelLinear(
            cfg.hidden_size, [key_dim, key_dim, value_dim, value_dim], {(0, 3), (3, 1)}, tp, method
        )
        self.in_proj_ba = SectionedColumnParallelLinear(
            cfg.hidden_size, [cfg.num_v_heads, cfg.num_v_heads], {(0, 1), (1, 1)}, tp, None
        )
        self.checkpoint_parts = {
            "in_proj_qkv": ("in_proj_qkvz", (0, 3)),
            "in_proj_z": ("in_proj_qkvz", (3, 1)),
            "in_proj_b": ("in_proj_ba", (0, 1)),
            "in_proj_a": ("in_proj_ba", (1, 1)),
        }

    def forward(self, hidden: torch.Tensor) -> Projected:
        conv_dim = sum(self.in_proj_qkvz.parts[:3])
        qkv, z = self.in_proj_qkvz(hidden).split([conv_dim, self.in_proj_qkvz.parts[3]], -1)
        b, a = self.in_proj_ba(hidden).chunk(2, dim=-1)
        return qkv, z.unflatten(-1, (-1, self.cfg.head_v_dim)), b, a
