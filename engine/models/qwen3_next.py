"""Qwen3-Next: Gated DeltaNet layers (``layers/linear_attention``) and gated full-attention
layers in the pattern ``layer_types`` gives (three linear to one full by default), each
followed by Qwen3-MoE's experts with Qwen2-MoE's gated shared expert (or a dense MLP where
the config says).

What sets its attention apart: q_proj gives each head its query and a gate, and the head's
output is multiplied by ``sigmoid(gate)`` before o_proj; q and k are RMSNormed per head; RoPE
turns only ``partial_rotary_factor`` of each head. Its RMSNorms scale by ``1 + weight``
(folded into the weight as it loads, as Gemma's), but for the Gated DeltaNet's gated norm.
Qwen3.5 (``qwen3_5.py``, ``qwen3_5_moe.py``) is this model with the other DeltaNet
checkpoint layout. A checkpoint's multi-token-prediction layer (``mtp.*``) is not loaded.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.layer import Attention, KVCache
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear_attention.gated_delta_net import GatedDeltaNet
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from kvserve.engine.models.decoder import MLP, Switches, build_attention
from kvserve.engine.models.gemma3 import gemma_norm
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.moe_decoder import MoEDecoderLM
from kvserve.engine.quantization.linear_methods import linear_method


class HybridDecoderLayer(nn.Module):
    """A token mixer (``self_attn``, gated attention; or ``linear_attn``, a Gated DeltaNet)
    and an MLP, each after a ``1 + weight`` RMSNorm, as ``DecoderLayer`` runs them."""

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallel,
        prefix: str,
        mlp: nn.Module,
        linear: bool,
    ) -> None:
        super().__init__()
        eps, quant = cfg.rms_norm_eps, cfg.quantization
        self.linear_attn: GatedDeltaNet | None = None
        self.self_attn: Attention | None = None
        if linear:
            assert cfg.gated_delta_net is not None
            kernels = "triton" if backend.name == "triton" else "torch"
            method = linear_method(quant, [f"{prefix}.linear_attn.out_proj"])
            self.linear_attn = GatedDeltaNet(cfg.gated_delta_net, tp, method, kernels)
        else:
            switches = Switches(cfg.attention_bias, cfg.attention_bias, qk_norm=True)
            self.self_attn = build_attention(
                cfg, switches, rotary, backend, tp, prefix, output_gate=True
            )
            assert self.self_attn.q_norm is not None and self.self_attn.k_norm is not None
            gemma_norm(self.self_attn.q_norm)
            gemma_norm(self.self_attn.k_norm)
        self.input_layernorm = gemma_norm(RMSNorm(cfg.hidden_size, eps))
        self.post_attention_layernorm = gemma_norm(RMSNorm(cfg.hidden_size, eps))
        self.mlp = mlp

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cache: KVCache,
        meta: AttentionMetadata | StateMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``DecoderLayer.forward``; ``cache`` and ``meta`` are a linear-attention
        layer's state tensors and ``StateMetadata``."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed = self.input_layernorm(hidden, residual)
        if self.linear_attn is not None:
            assert isinstance(meta, StateMetadata)
            hidden = self.linear_attn(normed, cache, meta)
            if out_rows is not None:
                hidden = hidden[out_rows]
        else:
            assert self.self_attn is not None and isinstance(meta, AttentionMetadata)
            hidden = self.self_attn(positions, normed, cache, meta, out_rows)
        if out_rows is not None:
            residual = residual[out_rows]
        return self.mlp(self.post_attention_layernorm(hidden, residual)), residual


class Qwen3NextForCausalLM(MoEDecoderLM):
    block = "mlp"

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        tp: TensorParallel = TensorParallel(),
    ) -> None:
        nn.Module.__init__(self)  # the layers are hybrid, not DecoderLM's
        if cfg.gated_delta_net is None:
            raise ValueError(f"config.json of a {cfg.architecture} names no linear_* fields")
        self.config = cfg
        self.tp = tp
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, max_positions)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        prefixes = [f"model.layers.{i}" for i in range(cfg.num_layers)]
        self.layers = nn.ModuleList(
            HybridDecoderLayer(
                cfg, self.rotary, backend, tp, p, self.build_mlp(i, p), i in cfg.linear_layers
            )
            for i, p in enumerate(prefixes)
        )
        self.norm = gemma_norm(RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)

    def build_mlp(self, layer: int, prefix: str) -> nn.Module:
        """The MoE block where the config has experts, else the dense MLP."""
        if self.config.moe is None:
            return MLP(self.config, self.tp, f"{prefix}.mlp")
        return super().build_mlp(layer, prefix)

    def checkpoint_name(self, name: str) -> str | None:
        """Not the multi-token-prediction layer (``mtp.*``): only the next token is sampled."""
        return None if name.startswith("mtp.") else name

    def checkpoint_tensors(self) -> Mapping[str, tuple[str, Any]]:
        tensors = dict(super().checkpoint_tensors()) if self.config.moe is not None else {}
        delta_net = next(m for m in self.modules() if isinstance(m, GatedDeltaNet))
        for name, (ours, shard_id) in delta_net.checkpoint_parts.items():
            tensors[f"linear_attn.{name}.weight"] = (f"linear_attn.{ours}.weight", shard_id)
        return tensors
