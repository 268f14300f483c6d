"""The Gemma facts of a checkpoint's config.json that the shared ``ModelConfig`` lacks."""

from dataclasses import dataclass

GEMMA_FAMILIES = ("gemma3",)
MULTIMODAL = (
    "Gemma3ForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
"""Architectures whose config.json nests the language model's under ``text_config``."""
GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)


@dataclass(frozen=True)
class GemmaConfig:
    query_pre_attn_scalar: float
    """Attention scores are ``q . k / sqrt(query_pre_attn_scalar)``."""
    local_rope_theta: float
    """The RoPE base of the sliding-window layers (the global layers': ``ModelConfig.rope``)."""
    final_logit_softcapping: float | None

    @classmethod
    def from_dict(cls, raw: dict, family: str) -> "GemmaConfig | None":
        if family not in GEMMA_FAMILIES:
            return None
        activation = raw.get("hidden_activation") or raw.get("hidden_act") or GEMMA_ACTIVATIONS[0]
        if activation not in GEMMA_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_activation {activation!r}; supported: {GEMMA_ACTIVATIONS}"
            )
        return cls(
            query_pre_attn_scalar=raw.get("query_pre_attn_scalar", 256),
            local_rope_theta=local_rope_parameters(raw).get("rope_theta", 10000.0),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
        )


def _nested(raw: dict) -> dict:
    params = raw.get("rope_parameters") or {}
    return params if "full_attention" in params or "sliding_attention" in params else {}


def global_rope_config(raw: dict) -> dict:
    """``raw`` with the global layers' RoPE as the top-level one: transformers 5 nests each
    layer type's under ``rope_parameters``; older configs give ``rope_theta`` (default 1e6)
    and ``rope_scaling`` for the global layers."""
    nested = _nested(raw)
    if nested:
        return {**raw, "rope_parameters": nested.get("full_attention") or {}, "rope_scaling": None}
    return {**raw, "rope_theta": raw.get("rope_theta", 1_000_000.0)}


def local_rope_parameters(raw: dict) -> dict:
    """The sliding-window layers' RoPE parameters (older configs: ``rope_local_base_freq``)."""
    nested = _nested(raw)
    if nested:
        return nested.get("sliding_attention") or {}
    return {"rope_theta": raw.get("rope_local_base_freq", 10000.0)}


def language_model_config(raw: dict) -> dict:
    """The language model's config of a ``MULTIMODAL`` checkpoint's ``raw``, with the
    top-level settings that are the whole model's (architecture, dtype, ties, EOS)."""
    text = dict(raw.get("text_config") or {})
    for key in ("architectures", "dtype", "torch_dtype", "tie_word_embeddings", "eos_token_id"):
        if key in raw:
            text[key] = raw[key]
    return text
