"""kvserve: a paged-KV LLM serving engine, its OpenAI-compatible server and its Kubernetes operator.

``LLM``, ``LoRARequest`` and ``SamplingParams`` load lazily, so the operator (``kvserve.operator``)
imports without torch.
"""

__all__ = ["LLM", "LoRARequest", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from kvserve.engine.llm import LLM

        return LLM
    if name == "LoRARequest":
        from kvserve.engine.lora.lora_request import LoRARequest

        return LoRARequest
    if name == "SamplingParams":
        from kvserve.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'kvserve' has no attribute {name!r}")
