"""Self-attention over this rank's heads: q/k/v projection (column-parallel, kv heads split
or replicated as ``TensorParallel.kv_heads`` says), optional per-head RMSNorm on q and k,
rotary embedding, the paged KV cache through an attention backend, and the output
projection (row-parallel: one all-reduce)."""

import torch
from torch import nn

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear import LinearMethod, QKVParallelLinear, RowParallelLinear
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel

KVCache = tuple[torch.Tensor, torch.Tensor]
"""One layer's (key, value) cache of this rank's kv heads:
``[num_blocks, block_size, kv heads per rank, head_dim]`` each."""


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
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallel,
        qkv_method: LinearMethod | None = None,
        o_method: LinearMethod | None = None,
    ) -> None:
        """``qk_norm_eps``: the epsilon of RMSNorms on each q and k head (Qwen3), or None;
        ``*_method``: the projections' weight methods (None: unquantized)."""
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            hidden_size, head_dim, num_heads, num_kv_heads, qkv_bias, tp, qkv_method
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            num_heads * head_dim, hidden_size, o_bias, tp, o_method, "attention output features"
        )
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm, self.k_norm = (
                RMSNorm(head_dim, qk_norm_eps),
                RMSNorm(head_dim, qk_norm_eps),
            )
        self.rotary = rotary
        self.backend = backend
        self.scale = head_dim**-0.5

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
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        key_cache, value_cache = kv_cache
        self.backend.store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
        out = self.backend.attend(q, key_cache, value_cache, meta, self.scale)
        return self.o_proj((out if out_rows is None else out[out_rows]).flatten(1))
