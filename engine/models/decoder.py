"""One decoder-only transformer for the Llama, Mistral, Qwen2 and Qwen3 families.

They differ only in switches read from config.json: grouped-query attention,
a bias on q/k/v (Qwen2), per-head RMSNorm on q and k (Qwen3), RoPE scaling and
tied embeddings. q/k/v and gate/up projections are fused into one matmul each.
"""

import torch
from torch import nn

from kvserve.engine.attention.backend import AttentionBackend
from kvserve.engine.attention.metadata import AttentionMetadata
from kvserve.engine.cdiv import cdiv
from kvserve.engine.models import fused_ops
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.rope import RotaryEmbedding

KVCache = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised ``x``; with ``residual``, first ``residual += x`` in place and the
        normalised sum (the residual stream's add fused into the norm)."""
        return fused_ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, backend: AttentionBackend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias
        )
        o_bias = cfg.qkv_bias and cfg.family != "qwen2"  # Llama's attention_bias covers o_proj
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary
        self.backend = backend
        self.scale = cfg.head_dim**-0.5

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


# The most bytes of gate/up activation one CPU pass of the MLP makes (see MLP).
CPU_MLP_CHUNK_BYTES = 16 << 20


class MLP(nn.Module):
    """On a CPU a large batch goes through in row chunks whose gate/up activation stays
    under CPU_MLP_CHUNK_BYTES. glibc gives every block of 32 MiB or more a fresh mmap and
    unmaps it when freed, so a bigger activation faults in (and the kernel zeroes) every
    page of it again in every layer: a 2048-token float32 step of the 134M model (its
    gate/up output is exactly 32 MiB) ran ~10 % slower (benchmarks/cpu-levers.md). Chunks
    this size reuse the heap's blocks and are still large matmuls; they are equal, so that the
    linear kernels' threads get equal shares of each (1,336 rows: 668 + 668, not 1,024 + 312)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_width = 2 * cfg.intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        most = max(1, CPU_MLP_CHUNK_BYTES // (self.gate_up_width * x.element_size()))
        if x.device.type != "cpu" or x.shape[0] <= most:
            return self._rows(x)
        chunks = cdiv(x.shape[0], most)
        return torch.cat([self._rows(part) for part in x.split(cdiv(x.shape[0], chunks))])

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused_ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, backend: AttentionBackend):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, rotary, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream is ``residual + hidden`` (``residual`` None: ``hidden``
        alone); returns this layer's (hidden, residual), the stream being their sum again,
        for every row or for rows ``out_rows`` alone. ``residual`` is updated in place."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, normed, kv_cache, meta, out_rows)
        if out_rows is not None:
            residual = residual[out_rows]
        return self.mlp(self.post_attention_layernorm(hidden, residual)), residual


class DecoderLM(nn.Module):
    """Token ids of a flat batch → hidden states; ``logits`` maps chosen rows to the vocabulary."""

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, max_positions)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, self.rotary, backend) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(
        self,
        input_ids,
        positions,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The last layer's hidden states of every row, or of rows ``out_rows`` alone (in
        that order). Every row's keys and values go to the cache either way, but in the last
        layer nothing else of a row is ever read unless its hidden state is: there the
        output projection and the MLP run on rows ``out_rows`` alone. In a prefill step
        that is one row per prompt: 6 % of the 134M model's matmul work skipped."""
        hidden, residual = self.run_layers(
            self.embed_tokens(input_ids), positions, kv_caches, meta, out_rows
        )
        return residual + hidden

    def run_layers(
        self,
        hidden: torch.Tensor,
        positions,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` from the embedded tokens ``hidden`` (which become the residual
        stream's buffer, updated in place) to the last layer's (hidden, residual), whose sum
        is ``forward``'s result."""
        residual = None
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            rows = out_rows if i == last else None
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta, rows)
        assert residual is not None  # config.json names at least one layer
        return hidden, residual

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()
