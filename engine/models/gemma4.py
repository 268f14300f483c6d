"""Gemma 4 (text), as transformers 5.23 defines it: Gemma 3's layers (``gemma3.py``) with
RMSNorm weights taken as they are (not ``1 + weight``), each v head RMSNormed without a
weight, attention unscaled (scale 1: the q and k norms set it), proportional RoPE on the
global layers (a share of each head's pairs rotates), and each layer's output multiplied by
its learned ``layer_scalar``.

Per-layer input embeddings, keys and values shared across layers, keys used as values,
mixture-of-experts blocks, bidirectional attention and global layers of another head size
than the sliding ones are refused as the config is read (``gemma_config.GEMMA4_REFUSED``,
``refuse_gemma4_features``): every layer of a KV page has one shape here.
"""

import torch
from torch import nn

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.layer import KVCache
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.gemma3 import (
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    language_model_name,
)
from kvserve.engine.models.model_config import ModelConfig


class Gemma4DecoderLayer(Gemma3DecoderLayer):
    PLUS_ONE_NORMS = False
    V_NORM = True

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        window: int | None,
        backend: AttentionBackend,
        tp: TensorParallel,
        prefix: str,
    ) -> None:
        super().__init__(cfg, rotary, window, backend, tp, prefix)
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma 3's layer, its output stream (``hidden + residual``) times ``layer_scalar``."""
        hidden, stream = super().forward(positions, hidden, residual, kv_cache, meta, out_rows)
        return hidden * self.layer_scalar, stream * self.layer_scalar


class Gemma4ForCausalLM(Gemma3ForCausalLM):
    decoder_layer = Gemma4DecoderLayer


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The language model of a Gemma 4 checkpoint of several modalities, for text-only
    serving: the vision and audio towers and their projectors are skipped."""

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
