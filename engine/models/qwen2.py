"""Qwen2 and Qwen2.5: a bias on q, k and v, never on o."""

from kvserve.engine.models.decoder import DecoderLM, Switches
from kvserve.engine.models.model_config import ModelConfig


class Qwen2ForCausalLM(DecoderLM):
    @classmethod
    def switches(cls, cfg: ModelConfig) -> Switches:
        return Switches(qkv_bias=True, o_bias=False)
