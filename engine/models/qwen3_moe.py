"""Qwen3-MoE: Qwen3's attention; softmax top-k routing, renormalised if ``norm_topk_prob``;
dense MLPs in ``mlp_only_layers`` and off the ``decoder_sparse_step``."""

from kvserve.engine.models.moe_decoder import MoEDecoderLM
from kvserve.engine.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(MoEDecoderLM, Qwen3ForCausalLM):
    pass
