"""A draft model's share of the KV cache, known from its config alone (the plan sizes the
block pool before any model loads)."""

import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.models.model_config import ModelConfig


def draft_config(config: EngineConfig) -> ModelConfig | None:
    """The draft checkpoint's config (None without a draft model)."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None
    return ModelConfig.from_dir(spec.model)


def draft_kv_block_bytes(config: EngineConfig, block_size: int, dtype: torch.dtype) -> int:
    """The draft's share of one block: its keys and values of ``block_size`` tokens in
    every layer (0 without a draft model)."""
    cfg = draft_config(config)
    if cfg is None:
        return 0
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize
