"""Llama (1-3.x) and Mistral: the shared decoder as it is; ``attention_bias`` puts a bias
on q, k, v and o; RoPE scaling (llama3, yarn, ...) is read from config.json (``RopeConfig``)."""

from kvserve.engine.models.decoder import DecoderLM


class LlamaForCausalLM(DecoderLM):
    pass
