"""The Gemma facts of a checkpoint's config.json that the shared ``ModelConfig`` lacks."""

from dataclasses import dataclass

GEMMA_FAMILIES = ("gemma3", "gemma4")
MULTIMODAL = (
    "Gemma3ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)
"""Architectures whose config.json nests the language model's under ``text_config``."""
GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)


@dataclass(frozen=True)
class GemmaConfig:
    query_pre_attn_scalar: float
    """Attention scores are ``q . k / sqrt(query_pre_attn_scalar)`` (Gemma 4: 1, its q and k
    norms set the scale)."""
    local_rope_theta: float
    """The RoPE base of the sliding-window layers (the global layers': ``ModelConfig.rope``)."""
    final_logit_softcapping: float | None
    per_layer_input_size: int = 0
    """Gemma 4's per-layer input embeddings: each layer's input width (0: none)."""
    per_layer_vocab_size: int = 0
    """The rows of their table (``vocab_size_per_layer_input``)."""

    @classmethod
    def from_dict(cls, raw: dict, family: str) -> "GemmaConfig | None":
        if family not in GEMMA_FAMILIES:
            return None
        activation = raw.get("hidden_activation") or raw.get("hidden_act") or GEMMA_ACTIVATIONS[0]
        if activation not in GEMMA_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_activation {activation!r}; supported: {GEMMA_ACTIVATIONS}"
            )
        gemma4 = family == "gemma4"
        if gemma4:
            refuse_gemma4_features(raw)
        return cls(
            query_pre_attn_scalar=1.0 if gemma4 else raw.get("query_pre_attn_scalar", 256),
            local_rope_theta=local_rope_parameters(raw).get("rope_theta", 10000.0),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            per_layer_input_size=raw.get("hidden_size_per_layer_input", 256) if gemma4 else 0,
            per_layer_vocab_size=raw.get("vocab_size_per_layer_input", 262_144) if gemma4 else 0,
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


GEMMA4_REFUSED = {
    # config field: (transformers' default, what it turns on)
    "num_kv_shared_layers": (0, "keys and values shared across layers"),
    "enable_moe_block": (False, "mixture-of-experts blocks"),
    "attention_k_eq_v": (False, "keys used as values"),
    "use_bidirectional_attention": (None, "bidirectional attention"),
}
"""The Gemma 4 features not served: a config that turns one on is refused, naming it."""


def refuse_gemma4_features(raw: dict) -> None:
    """A ValueError naming the first field of ``raw`` that turns on a Gemma 4 feature not
    served (``GEMMA4_REFUSED``), or that gives a layer another head size or kv head count
    than ``head_dim`` and ``num_key_value_heads`` (every layer of a KV page has one shape)."""
    for field, (default, feature) in GEMMA4_REFUSED.items():
        if value := raw.get(field, default):
            raise ValueError(f"{field}={value!r} is not supported (Gemma 4 {feature})")
    head_dim, kv_heads = raw.get("head_dim", 256), raw.get("num_key_value_heads", 4)
    if "per_layer_config" in raw:
        overrides = {f"per_layer_config[{i}]": c for i, c in raw["per_layer_config"].items()}
    else:  # transformers' default: the global layers' head size is global_head_dim (512)
        overrides = {"global_head_dim": {"head_dim": raw.get("global_head_dim", 512)}}
    for field, layer in overrides.items():
        shape = (layer.get("head_dim", head_dim), layer.get("num_key_value_heads", kv_heads))
        if shape != (head_dim, kv_heads):
            raise ValueError(
                f"Gemma 4 layers of another head size or kv head count ({field}: {layer}) than "
                f"head_dim={head_dim}, num_key_value_heads={kv_heads} are not supported (one "
                "KV page size for every layer)"
            )


GEMMA4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1e6,
    },
}


def gemma4_defaults(raw: dict) -> dict:
    """``raw`` with ``layer_types`` and ``rope_parameters`` as transformers derives them for
    Gemma 4: five sliding layers to one full when unset, the last layer full attention
    whatever they say, and ``GEMMA4_ROPE`` when no RoPE is given."""
    count = raw["num_hidden_layers"]
    types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(count)
    ]
    if isinstance(types, list) and types:
        types = [*types[:-1], "full_attention"]
    return {
        **raw,
        "layer_types": types,
        "rope_parameters": raw.get("rope_parameters") or GEMMA4_ROPE,
    }
