"""Self-attention over this rank's heads: q/k/v projection (column-parallel, kv heads split
or replicated as ``TensorParallel.kv_heads`` says), optional per-head RMSNorm on q and k,
rotary embedding, the paged KV cache through an attention backend, and the output
projection (row-parallel: one all-reduce)."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.fp8_kv import KVScales
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear import (
    LinearMethod,
    QKVParallelLinear,
    RowParallelLinear,
    read,
    set_weight_loader,
)
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel

KVCache = tuple[torch.Tensor, torch.Tensor]
"""One layer's (key, value) cache of this rank's kv heads:
``[num_blocks, block_size, kv heads per rank, head_dim]`` each, in the model's dtype or
e4m3 (``fp8_kv``)."""


class Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm_eps: float | None,
        v_norm_eps: float | None = None,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallel,
        qkv_method: LinearMethod | None = None,
        o_method: LinearMethod | None = None,
        sliding_window: int | None = None,
        sinks: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
        output_gate: bool = False,
        projections: str = "qkv",
    ) -> None:
        """``qk_norm_eps``: the epsilon of RMSNorms on each q and k head (Qwen3), or None;
        ``v_norm_eps``: that of an RMSNorm without weight on each v head (Gemma 4), or None;
        ``*_method``: the projections' weight methods (None: unquantized).
        ``sliding_window``, ``softcap``: this layer's window and logit soft-cap, as
        ``AttentionBackend.attend`` takes them (None: none); ``sinks``: the layer has
        learned attention sinks, a parameter ``sinks`` (checkpoint ``self_attn.sinks``)
        of one logit per query head, split over the ranks as the query heads are;
        ``scale``: the softmax scale (None: ``head_dim**-0.5``); ``output_gate``: q_proj
        also gives each head a gate, and the head's output is multiplied by its sigmoid
        before the output projection (Qwen3-Next, Qwen3.5); ``projections``: ``qkv``, or
        ``qk`` (the values are the keys as projected, before the k norm and RoPE: Gemma 4's
        ``attention_k_eq_v``), or ``q`` (the layer stores no keys and values and has no k
        norm: it attends over the cache it is handed, another layer's: Gemma 4's KV-shared
        layers)."""
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"a sliding window must be at least 1 token, got {sliding_window}")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"an attention logit soft-cap must be positive, got {softcap}")
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            hidden_size,
            head_dim,
            num_heads,
            num_kv_heads,
            qkv_bias,
            tp,
            qkv_method,
            output_gate,
            projections,
        )
        self.projections = projections
        self.output_gate = output_gate
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            num_heads * head_dim, hidden_size, o_bias, tp, o_method, "attention output features"
        )
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            if projections != "q":
                self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        self.v_norm_eps = v_norm_eps
        self.rotary = rotary
        self.backend = backend
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window, self.softcap = sliding_window, softcap
        self.sinks = self._sinks_parameter(tp) if sinks else None
        self.kv_scales = KVScales()
        self.k_scale = self._kv_scale_parameter("k")
        self.v_scale = self._kv_scale_parameter("v")

    def _sinks_parameter(self, tp: TensorParallel) -> nn.Parameter:
        """This rank's query heads' sinks, kept in float32 whatever the checkpoint's dtype."""
        param = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32), requires_grad=False)
        first = tp.rank * self.num_heads

        def load(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
            with torch.no_grad():
                param.copy_(read(loaded, 0, first, self.num_heads))

        set_weight_loader(param, load)
        return param

    def _kv_scale_parameter(self, which: str) -> nn.Parameter:
        """The checkpoint's per-tensor scale of an FP8 KV cache's keys (``k``) or values
        (``v``): optional (a checkpoint without it leaves 1.0), the same on every rank.
        Loading it also sets ``kv_scales``, the host floats the backend takes each step (no
        device read in the forward)."""
        param = nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)
        param.optional = True  # type: ignore[attr-defined]

        def load(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
            values = loaded[...].float().reshape(-1)  # shape [] or [1], as exporters write it
            if values.numel() != 1 or not bool(values[0] > 0) or not values.isfinite().all():
                raise ValueError(f"a {which}_scale must be one positive number, got {values}")
            value = float(values[0])
            with torch.no_grad():
                param.fill_(value)
            self.kv_scales = self.kv_scales._replace(**{which: value})

        set_weight_loader(param, load)
        return param

    def forward(
        self,
        positions,
        hidden,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ):
        """Every row's key and value go to the cache; the output is that of every row, or
        of rows ``out_rows`` alone (the output projection runs on them only)."""
        q, *kv = self.qkv_proj(hidden).split(
            [self.q_size, *[self.kv_size] * (len(self.projections) - 1)], dim=-1
        )
        gate = None
        if self.output_gate:
            q, gate = q.view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            q = q.contiguous()
        q = q.view(-1, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        key_cache, value_cache = kv_cache
        scales = self.kv_scales
        if kv:
            k = kv[0].view(-1, self.num_kv_heads, self.head_dim)
            v = kv[-1].view(-1, self.num_kv_heads, self.head_dim)
            if self.v_norm_eps is not None:
                v = F.rms_norm(v, (self.head_dim,), eps=self.v_norm_eps)
            elif self.projections == "qk":  # the rotation below may turn k in place
                v = v.clone()
            if self.k_norm is not None:
                k = self.k_norm(k)
            q, k = self.rotary(positions, q, k)
            self.backend.store_kv(k, v, key_cache, value_cache, meta.slot_mapping, scales)
        else:
            q = self.rotary.query(positions, q)
        out = self.backend.attend(
            q,
            key_cache,
            value_cache,
            meta,
            self.scale,
            scales,
            window=self.sliding_window,
            sinks=self.sinks,
            softcap=self.softcap,
        )
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj((out if out_rows is None else out[out_rows]).flatten(1))
