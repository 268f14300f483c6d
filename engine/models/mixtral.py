"""Mixtral: Mistral's attention; softmax top-k routing, always renormalised; the block is
``block_sparse_moe`` and an expert's projections ``w1`` (gate), ``w3`` (up), ``w2`` (down)."""

from kvserve.engine.models.moe_decoder import MoEDecoderLM


class MixtralForCausalLM(MoEDecoderLM):
    block = "block_sparse_moe"
    expert_names = ("w1", "w3", "w2")
