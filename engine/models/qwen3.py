"""Qwen3: an RMSNorm on each query and key head before RoPE; ``attention_bias`` as Llama's."""

import dataclasses

from kvserve.engine.models.decoder import DecoderLM, Switches
from kvserve.engine.models.model_config import ModelConfig


class Qwen3ForCausalLM(DecoderLM):
    @classmethod
    def switches(cls, cfg: ModelConfig) -> Switches:
        return dataclasses.replace(super().switches(cfg), qk_norm=True)
