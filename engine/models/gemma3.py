"""Gemma 3 (text): the shared decoder's layers arranged Gemma's way.

What sets it apart: RMSNorms scale by ``1 + weight`` (folded into the weight as it loads:
the same product, one add fewer per step), four norms per layer (before and after the
attention and the MLP, the "sandwich"), the embedding scaled by ``sqrt(hidden_size)``, a
GeGLU MLP (tanh-approximated GELU), attention scaled by ``query_pre_attn_scalar**-0.5``
with q and k RMSNormed per head, sliding-window layers (``layer_types``) with their own
RoPE base next to the global layers', and an optional final logit soft-cap. (Gemma 3's
config also names ``attn_logit_softcapping``; transformers' Gemma 3 attention ignores it, and
so does this one.)
"""

import re
from typing import Any, ClassVar

import torch
from torch import nn

from kvserve.engine.layers.activation import gelu_tanh_and_mul
from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.layer import KVCache
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear import default_weight_loader, set_weight_loader
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from kvserve.engine.models.decoder import MLP, DecoderLM, Switches, build_attention
from kvserve.engine.models.model_config import ModelConfig, RopeConfig


def _load_plus_one(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
    default_weight_loader(param, loaded, shard_id)
    with torch.no_grad():
        param.add_(1.0)


def gemma_norm(norm: RMSNorm) -> RMSNorm:
    """``norm`` loading Gemma's ``weight`` as ``1 + weight``."""
    set_weight_loader(norm.weight, _load_plus_one)
    return norm


class GeGLU(MLP):
    """The dense MLP with ``gelu_tanh(gate) * up``."""

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    PLUS_ONE_NORMS: ClassVar[bool] = True
    """Norm weights load as ``1 + weight`` (Gemma 4's load as they are)."""
    V_NORM: ClassVar[bool] = False
    """Each v head is RMSNormed without weight (Gemma 4)."""

    def norm(self, norm: RMSNorm) -> RMSNorm:
        return gemma_norm(norm) if self.PLUS_ONE_NORMS else norm

    @classmethod
    def attention_kind(cls, cfg: ModelConfig, layer: int, window: int | None) -> dict[str, Any]:
        """``Attention``'s keywords particular to layer ``layer`` (window ``window``)."""
        return {}

    @classmethod
    def mlp_size(cls, cfg: ModelConfig, layer: int) -> tuple[int, str] | None:
        """Layer ``layer``'s MLP width as ``MLP`` takes it (None: ``intermediate_size``)."""
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
        """``layer``: this layer's index (``prefix``: the checkpoint's name of it)."""
        super().__init__()
        assert cfg.gemma is not None
        eps = cfg.rms_norm_eps
        switches = Switches(cfg.attention_bias, cfg.attention_bias, qk_norm=True)
        self.self_attn = build_attention(
            cfg,
            switches,
            rotary,
            backend,
            tp,
            prefix,
            v_norm_eps=eps if self.V_NORM else None,
            sliding_window=window,
            scale=cfg.gemma.query_pre_attn_scalar**-0.5,
            num_kv_heads=cfg.kv_shape(layer)[0],
            head_dim=cfg.kv_shape(layer)[1],
            **self.attention_kind(cfg, layer, window),
        )
        for qk_norm in (self.self_attn.q_norm, self.self_attn.k_norm):
            if qk_norm is not None:  # a KV-shared layer has no k norm
                self.norm(qk_norm)
        size = cfg.hidden_size
        self.input_layernorm = self.norm(RMSNorm(size, eps))
        self.post_attention_layernorm = self.norm(RMSNorm(size, eps))
        self.pre_feedforward_layernorm = self.norm(RMSNorm(size, eps))
        self.post_feedforward_layernorm = self.norm(RMSNorm(size, eps))
        self.mlp = GeGLU(cfg, tp, f"{prefix}.mlp", self.mlp_size(cfg, layer))

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``DecoderLayer.forward``: the stream is ``residual + hidden`` in and out."""
        stream = hidden if residual is None else residual + hidden
        attended = self.self_attn(positions, self.input_layernorm(stream), kv_cache, meta, out_rows)
        if out_rows is not None:
            stream = stream[out_rows]
        stream = stream + self.post_attention_layernorm(attended)
        return self.post_feedforward_layernorm(self.feed_forward(stream)), stream

    def feed_forward(self, stream: torch.Tensor) -> torch.Tensor:
        """The MLP's output of the residual ``stream``, before the post-feedforward norm."""
        return self.mlp(self.pre_feedforward_layernorm(stream))


class Gemma3ForCausalLM(DecoderLM):
    decoder_layer: ClassVar[type[Gemma3DecoderLayer]] = Gemma3DecoderLayer

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        tp: TensorParallel = TensorParallel(),
    ) -> None:
        nn.Module.__init__(self)  # the layers are Gemma's, not DecoderLM's
        assert cfg.gemma is not None
        self.config = cfg
        self.tp = tp
        windows = cfg.layer_windows or (None,) * cfg.num_layers
        # the global layers' head size (Gemma 4's global_head_dim), which their RoPE spans
        size = next((cfg.kv_shape(i)[1] for i, w in enumerate(windows) if w is None), None)
        self.rotary = RotaryEmbedding(cfg.rope, size or cfg.head_dim, max_positions)
        local = RopeConfig(theta=cfg.gemma.local_rope_theta)  # default RoPE, its own base
        self.local_rotary = RotaryEmbedding(local, cfg.head_dim, max_positions)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(
            self.decoder_layer(
                cfg,
                self.rotary if window is None else self.local_rotary,
                window,
                backend,
                tp,
                f"model.layers.{i}",
                i,
            )
            for i, window in enumerate(windows)
        )
        norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = gemma_norm(norm) if self.decoder_layer.PLUS_ONE_NORMS else norm
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings, scaled by ``sqrt(hidden_size)``."""
        embedded = self.embed_tokens(input_ids)
        return embedded * torch.tensor(self.config.hidden_size**0.5, dtype=embedded.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        assert self.config.gemma is not None
        cap = self.config.gemma.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


_LANGUAGE_MODEL = re.compile(r"^(?:model\.language_model\.|language_model\.model\.)")
_OTHER_MODALITIES = re.compile(
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector|embed_vision|audio_tower|embed_audio)\."
)


def language_model_name(name: str) -> str | None:
    """The text model's name of an image-text (Gemma 3) or any-to-text (Gemma 4) checkpoint's
    tensor ``name``; None for the vision and audio towers and their projectors."""
    if _OTHER_MODALITIES.match(name):
        return None
    if name == "language_model.lm_head.weight":
        return "lm_head.weight"
    return _LANGUAGE_MODEL.sub("model.", name)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The language model of a Gemma 3 image-text checkpoint, for text-only serving: the
    vision tower and the projector in the checkpoint are skipped."""

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
