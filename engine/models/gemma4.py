"""Gemma 4 (text), as transformers 5.23 defines it: Gemma 3's layers (``gemma3.py``) with
RMSNorm weights taken as they are (not ``1 + weight``), each v head RMSNormed without a
weight, attention unscaled (scale 1: the q and k norms set it), proportional RoPE on the
global layers (a share of each head's pairs rotates), each layer's output multiplied by its
learned ``layer_scalar``, and optionally per-layer input embeddings (PLE: each token brings
every layer an input of its own, which gates a residual branch after the MLP).

The last ``num_kv_shared_layers`` layers read the keys and values of the last earlier
layer of their kind (``ModelConfig.kv_owners``: its cache, its group's block table; they keep
no blocks and project queries only); with ``attention_k_eq_v`` the global layers' values are
their keys (before the k norm and RoPE); ``use_double_wide_mlp`` doubles the KV-shared
layers' MLPs. With ``enable_moe_block`` every layer has routed experts (GeGLU, stacked
``gate_up_proj``/``down_proj``) beside its dense MLP, each branch with norms of its own
(``Gemma4Router``). Global layers of another head size or kv head count than the sliding
ones fill KV pages of equal bytes (``core/kv_groups.py``). Bidirectional attention over text
is refused as the config is read (``gemma_config.refuse_gemma4_features``).
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.layer import KVCache
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear import ReplicatedLinear
from kvserve.engine.layers.moe.fused_moe import FusedMoE
from kvserve.engine.layers.moe.router import SoftmaxTopK
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.layers.vocab_parallel import VocabParallelEmbedding
from kvserve.engine.models.decoder import StepMetadata
from kvserve.engine.models.gemma3 import (
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    language_model_name,
)
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.moe_config import MoEConfig


class Gemma4Router(nn.Module):
    """Gemma 4's router: the stream RMSNormed without weight, scaled by ``scale /
    sqrt(hidden)``, projected to the experts' logits; the renormalised top-k softmax
    weights each times its expert's ``per_expert_scale``."""

    def __init__(self, cfg: ModelConfig, moe: MoEConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.eps, self.hidden_size = cfg.rms_norm_eps, cfg.hidden_size
        self.proj = ReplicatedLinear(cfg.hidden_size, moe.num_experts, False, tp)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts), requires_grad=False)
        self.top_k = SoftmaxTopK(top_k=moe.top_k, renormalize=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids) of each row of ``x``, ``[T, top_k]`` each."""
        normed = F.rms_norm(x, (self.hidden_size,), eps=self.eps)
        weights, ids = self.top_k(self.proj(normed * self.scale * self.hidden_size**-0.5))
        return weights * self.per_expert_scale.float()[ids.long()], ids


class Gemma4DecoderLayer(Gemma3DecoderLayer):
    PLUS_ONE_NORMS = False
    V_NORM = True

    @classmethod
    def attention_kind(cls, cfg: ModelConfig, layer: int, window: int | None) -> dict[str, Any]:
        """A KV-shared layer projects queries only; with ``attention_k_eq_v`` a global
        layer projects no values (they are its keys)."""
        assert cfg.gemma is not None
        if layer in cfg.kv_shared_layers:
            return {"projections": "q"}
        return {"projections": "qk"} if cfg.gemma.k_eq_v and window is None else {}

    @classmethod
    def mlp_size(cls, cfg: ModelConfig, layer: int) -> tuple[int, str] | None:
        """A KV-shared layer's MLP is twice as wide with ``use_double_wide_mlp``."""
        assert cfg.gemma is not None
        if cfg.gemma.double_wide_mlp and layer in cfg.kv_shared_layers:
            return 2 * cfg.intermediate_size, "intermediate_size (doubled: use_double_wide_mlp)"
        return None

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        window: int | None,
        backend: AttentionBackend,
        tp: TensorParallel,
        prefix: str,
        layer: int,
    ) -> None:
        super().__init__(cfg, rotary, window, backend, tp, prefix, layer)
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)
        assert cfg.gemma is not None
        self.tp = tp
        self.experts: FusedMoE | None = None
        if cfg.moe is not None:  # enable_moe_block: experts beside the dense MLP
            eps, hidden = cfg.rms_norm_eps, cfg.hidden_size
            self.router = Gemma4Router(cfg, cfg.moe, tp)
            self.experts = FusedMoE(
                cfg.moe.num_experts, hidden, cfg.moe.intermediate_size, tp,
                activation="gelu_tanh", layout="gate_up",
            )  # fmt: skip
            self.pre_feedforward_layernorm_2 = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_1 = RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(hidden, eps)
        size, hidden = cfg.gemma.per_layer_input_size, cfg.hidden_size
        if size:
            self.per_layer_input_gate = ReplicatedLinear(hidden, size, False, tp)
            self.per_layer_projection = ReplicatedLinear(size, hidden, False, tp)
            self.post_per_layer_input_norm = RMSNorm(hidden, cfg.rms_norm_eps)

    def feed_forward(self, stream: torch.Tensor) -> torch.Tensor:
        """The dense MLP's output; with experts, each branch normed after it and summed (the
        experts take the stream through a norm of their own, routed on the stream)."""
        dense = super().feed_forward(stream)
        if self.experts is None:
            return dense
        weights, ids = self.router(stream)
        routed = self.experts(self.pre_feedforward_layernorm_2(stream), weights, ids)
        routed = self.tp.all_reduce(routed)
        return self.post_feedforward_layernorm_1(dense) + self.post_feedforward_layernorm_2(routed)

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
        per_layer_input: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma 3's layer, then with ``per_layer_input`` (this layer's, of every row) the
        PLE branch; its output stream (``hidden + residual``) times ``layer_scalar``."""
        hidden, stream = super().forward(positions, hidden, residual, kv_cache, meta, out_rows)
        if per_layer_input is not None:
            stream = stream + hidden
            rows = per_layer_input if out_rows is None else per_layer_input[out_rows]
            gate = F.gelu(self.per_layer_input_gate(stream), approximate="tanh")
            hidden = self.post_per_layer_input_norm(self.per_layer_projection(gate * rows))
        return hidden * self.layer_scalar, stream * self.layer_scalar


class Gemma4ForCausalLM(Gemma3ForCausalLM):
    decoder_layer = Gemma4DecoderLayer

    def checkpoint_tensors(self) -> Mapping[str, tuple[str, Any]]:
        """The stacked experts' ``gate_up_proj`` and ``down_proj`` → ``w13``, ``w2``."""
        if self.config.moe is None:
            return {}
        return {
            "experts.gate_up_proj": ("experts.w13", None),
            "experts.down_proj": ("experts.w2", None),
        }

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        tp: TensorParallel = TensorParallel(),
    ) -> None:
        super().__init__(cfg, backend, max_positions, tp)
        assert cfg.gemma is not None
        self.per_layer_input_size = size = cfg.gemma.per_layer_input_size
        if size:
            self.layers_after_embed = False  # the layers take per-layer inputs too
            width = cfg.num_layers * size
            self.embed_tokens_per_layer = VocabParallelEmbedding(
                cfg.gemma.per_layer_vocab_size, width, tp
            )
            self.per_layer_model_projection = ReplicatedLinear(cfg.hidden_size, width, False, tp)
            self.per_layer_projection_norm = RMSNorm(size, cfg.rms_norm_eps)

    def per_layer_inputs(self, input_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Every layer's input of every token, ``[tokens, layers, per_layer_input_size]``:
        ``(norm(projection(embedded) / sqrt(hidden)) + table[token] * sqrt(size)) / sqrt(2)``."""
        size, dtype = self.per_layer_input_size, embedded.dtype
        shape = (-1, len(self.layers), size)
        table = self.embed_tokens_per_layer(input_ids) * torch.tensor(size**0.5, dtype=dtype)
        projected = self.per_layer_model_projection(embedded) * self.config.hidden_size**-0.5
        projected = self.per_layer_projection_norm(projected.view(shape))
        return (projected + table.view(shape)) * 2.0**-0.5

    def forward(
        self,
        input_ids,
        positions,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.per_layer_input_size:
            return super().forward(input_ids, positions, kv_caches, meta, out_rows)
        hidden = self.embed(input_ids)
        per_layer = self.per_layer_inputs(input_ids, hidden)
        residual = None
        last = len(self.layers) - 1
        metas = meta if isinstance(meta, list) else [meta] * len(self.layers)
        layers = zip(self.layers, kv_caches, metas, strict=True)
        for i, (layer, kv_cache, layer_meta) in enumerate(layers):
            rows = out_rows if i == last else None
            hidden, residual = layer(
                positions, hidden, residual, kv_cache, layer_meta, rows, per_layer[:, i]
            )
        assert residual is not None
        return residual + hidden


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The language model of a Gemma 4 checkpoint of several modalities, for text-only
    serving: the vision and audio towers and their projectors are skipped."""

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
