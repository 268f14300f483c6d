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
    k_eq_v: bool = False
    """Gemma 4's ``attention_k_eq_v``: the global layers' values are their keys (no v_proj)."""
    double_wide_mlp: bool = False
    """Gemma 4's ``use_double_wide_mlp``: the KV-shared layers' MLPs are twice as wide."""

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
            k_eq_v=gemma4 and bool(raw.get("attention_k_eq_v", False)),
            double_wide_mlp=gemma4 and bool(raw.get("use_double_wide_mlp", False)),
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


def refuse_gemma4_features(raw: dict) -> None:
    """A ValueError naming ``use_bidirectional_attention`` where it turns on bidirectional
    attention over every token; ``vision`` concerns image tokens alone, which text-only
    serving never has."""
    if (value := raw.get("use_bidirectional_attention")) not in (None, "vision"):
        raise ValueError(
            f"use_bidirectional_attention={value!r} is not supported (Gemma 4 bidirectional "
            "attention; 'vision', for image tokens only, is served for text)"
        )


def gemma4_kv_shapes(raw: dict, kv_heads: int, head_dim: int) -> tuple[tuple[int, int], ...]:
    """Each layer's (kv heads, head size) as transformers' Gemma 4 derives them (the
    sliding layers' ``kv_heads`` and ``head_dim``):
    ``per_layer_config``'s overrides, or by default the global layers' head size
    ``global_head_dim`` (512) and, with ``attention_k_eq_v``, their kv heads
    ``num_global_key_value_heads``."""
    if "per_layer_config" in raw:
        overrides = {int(i): c for i, c in raw["per_layer_config"].items()}
    else:
        layer: dict = {"head_dim": raw.get("global_head_dim", 512)}
        global_kv_heads = raw.get("num_global_key_value_heads")
        if global_kv_heads is not None and raw.get("attention_k_eq_v", False):
            layer["num_key_value_heads"] = global_kv_heads
        full = [i for i, kind in enumerate(raw["layer_types"]) if kind == "full_attention"]
        overrides = dict.fromkeys(full, layer)
    return tuple(
        (
            overrides.get(i, {}).get("num_key_value_heads", kv_heads),
            overrides.get(i, {}).get("head_dim", head_dim),
        )
        for i in range(raw["num_hidden_layers"])
    )


def kv_owners(raw: dict) -> tuple[int, ...]:
    """Each layer's layer whose keys and values it attends over, as transformers' Gemma 4
    shares them: the last ``num_kv_shared_layers`` layers read those of the last earlier
    layer of their type and keep none of their own; every other layer its own. Empty when
    none is shared."""
    count, shared = raw["num_hidden_layers"], raw.get("num_kv_shared_layers", 0)
    if not shared:
        return ()
    types, first = raw["layer_types"], count - shared
    if first < 1 or set(types[:first]) != set(types):
        raise ValueError(
            f"num_kv_shared_layers={shared} leaves no earlier layer of each type of the "
            f"{count} layers to share keys and values from"
        )
    last = {kind: i for i, kind in enumerate(types[:first])}
    return tuple(i if i < first else last[types[i]] for i in range(count))


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
