"""Qwen3.5-MoE: Qwen3.5's hybrid decoder with Qwen3-Next's experts and gated shared expert in
every layer; the top-k routing weights are always renormalised (its config has no
``norm_topk_prob``)."""

from kvserve.engine.layers.moe.router import Routing, SoftmaxTopK
from kvserve.engine.models.qwen3_5 import Qwen3_5ForCausalLM, language_model_name


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def routing(self) -> Routing:
        return SoftmaxTopK(self.moe.top_k, renormalize=True)


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    """The language model of a Qwen3.5-MoE image-text checkpoint."""

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
