"""Hugging Face architecture names (config.json's ``architectures``) → the model class that
runs them. Adding a family is its file in this folder and one line here."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.engine.models.decoder import DecoderLM

MODELS: dict[str, tuple[str, str]] = {
    # architecture: (family, "module.Class" in engine/models), imported on first use
    "LlamaForCausalLM": ("llama", "llama.LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "llama.LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "qwen2.Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "qwen3.Qwen3ForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "qwen2_moe.Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3_moe.Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "mixtral.MixtralForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "gpt_oss.GptOssForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "gemma3.Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("gemma3", "gemma3.Gemma3ForConditionalGeneration"),
    "Gemma4ForCausalLM": ("gemma4", "gemma4.Gemma4ForCausalLM"),
    "Gemma4ForConditionalGeneration": ("gemma4", "gemma4.Gemma4ForConditionalGeneration"),
    "Qwen3NextForCausalLM": ("qwen3_next", "qwen3_next.Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "qwen3_5.Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "qwen3_5.Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", "qwen3_5_moe.Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": (
        "qwen3_5_moe",
        "qwen3_5_moe.Qwen3_5MoeForConditionalGeneration",
    ),
}


def family(architecture: str) -> str:
    """The family name of ``architecture``; a ValueError naming it and the supported ones."""
    if architecture not in MODELS:
        supported = ", ".join(MODELS)
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {supported}")
    return MODELS[architecture][0]


def model_class(architecture: str) -> "type[DecoderLM]":
    family(architecture)  # the error for an unsupported one
    module, name = MODELS[architecture][1].rsplit(".", 1)
    cls: type[DecoderLM] = getattr(importlib.import_module(f"kvserve.engine.models.{module}"), name)
    return cls
