"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention; Qwen3-MoE's routing, plus a
shared expert every token goes through, scaled by ``sigmoid(shared_expert_gate(x))``."""

from kvserve.engine.models.moe_decoder import MoEDecoderLM
from kvserve.engine.models.qwen2 import Qwen2ForCausalLM


class Qwen2MoeForCausalLM(MoEDecoderLM, Qwen2ForCausalLM):
    pass
