"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention; Qwen3-MoE's routing, plus a
shared expert every token goes through, scaled by ``sigmoid(shared_expert_gate(x))``.
Its config's ``qkv_bias`` (default true) says whether q, k and v have biases."""

from kvserve.engine.models.decoder import Switches
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.moe_decoder import MoEDecoderLM
from kvserve.engine.models.qwen2 import Qwen2ForCausalLM


class Qwen2MoeForCausalLM(MoEDecoderLM, Qwen2ForCausalLM):
    @classmethod
    def switches(cls, cfg: ModelConfig) -> Switches:
        return Switches(qkv_bias=cfg.attention_bias, o_bias=False)
