"""The architecture facts the engine needs, read from a checkpoint's config.json."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from kvserve.engine.layers.linear_attention.config import GatedDeltaNetConfig
from kvserve.engine.models import registry
from kvserve.engine.models.gemma_config import (
    GEMMA_FAMILIES,
    MULTIMODAL,
    GemmaConfig,
    gemma4_defaults,
    gemma4_kv_shapes,
    global_rope_config,
    kv_owners,
    language_model_config,
)
from kvserve.engine.models.gguf_checkpoint import gguf_config, gguf_file
from kvserve.engine.models.moe_config import MoEConfig
from kvserve.engine.quantization.config import QuantConfig, read_quant_config


@dataclass(frozen=True)
class RopeConfig:
    """config.json's RoPE parameters; ``rotary.py`` turns them into frequencies.

    ``rope_type`` is one of ``ROPE_TYPES``. ``factor`` scales every type but default;
    ``low_freq_factor``/``high_freq_factor`` are llama3's; ``beta_fast``/``beta_slow``,
    ``truncate``, ``mscale``/``mscale_all_dim`` yarn's; ``short_factor``/``long_factor``
    longrope's (one per rotated pair). ``attention_factor``: the cos/sin scale a config
    states; None lets yarn and longrope derive theirs from ``factor``.
    ``partial_rotary_factor``: the share of each head that turns. Proportional's (Gemma 4):
    the share of the head's pairs that rotate, the rest keep frequency 0; any other type's
    (Qwen3-Next, Qwen3.5: 0.25): the head's leading dimensions turn as a head of that size
    would, the rest pass unrotated."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    partial_rotary_factor: float = 1.0


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    """config.json's, a key of ``registry.MODELS``."""
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    attention_bias: bool
    """The attention's projections have biases (``attention_bias``; ``BIAS_FIELDS``)."""
    tie_word_embeddings: bool | None  # None: decided by whether lm_head.weight exists
    torch_dtype: str | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    quantization: QuantConfig | None = None
    """The linear layers' quantization (``engine/quantization``); None: 16-bit."""
    moe: MoEConfig | None = None
    """The experts of a mixture-of-experts model; None: every layer's MLP is dense."""
    layer_windows: tuple[int | None, ...] = ()
    """Each layer's sliding window (None: full attention), for families whose
    ``layer_types`` alternate (``PER_LAYER_WINDOWS``): the windows live in the layers and
    ``sliding_window`` is None, so they do not cap the context. Empty: no per-layer window."""
    gemma: GemmaConfig | None = None
    """A Gemma family's own settings; None for the others."""
    linear_layers: tuple[int, ...] = ()
    """The Gated DeltaNet layers (``layer_types``' ``linear_attention``) of a
    ``HYBRID_FAMILIES`` model; the others are full attention."""
    gated_delta_net: GatedDeltaNetConfig | None = None
    """Those layers' shape; None without them."""
    layer_kv_shapes: tuple[tuple[int, int], ...] = ()
    """Each layer's (kv heads, head size) where they differ between layers (Gemma 4's global
    layers); empty: every layer's are ``num_kv_heads`` and ``head_dim``."""
    kv_owners: tuple[int, ...] = ()
    """Each layer's layer whose keys and values it attends over: itself, or for a KV-shared
    layer (Gemma 4's ``num_kv_shared_layers``) an earlier one of its kind, whose cache it
    reads (it keeps no blocks of its own). Empty: every layer its own."""

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """Layer ``layer``'s (kv heads, head size)."""
        if self.layer_kv_shapes:
            return self.layer_kv_shapes[layer]
        return self.num_kv_heads, self.head_dim

    @property
    def kv_shared_layers(self) -> tuple[int, ...]:
        """The layers that read another layer's keys and values (``kv_owners``)."""
        return tuple(i for i, owner in enumerate(self.kv_owners) if owner != i)

    @classmethod
    def from_dir(cls, path: str | Path, quantization: str | None = None) -> "ModelConfig":
        """A Hugging Face directory's config.json, or a GGUF file's metadata (``path`` is one,
        or a directory holding one). ``quantization``: ``--quantization``, a method to quantize
        a 16-bit checkpoint with as it loads."""
        path = Path(path)
        gguf = gguf_file(path)
        if gguf is not None:
            raw = gguf_config(gguf)
            return dataclasses.replace(
                cls.from_dict(raw), quantization=read_quant_config(gguf, raw, quantization)
            )
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in model directory {path}")
        raw = json.loads(config_file.read_text())
        quant = read_quant_config(path, raw, quantization)
        return dataclasses.replace(cls.from_dict(raw, _generation_eos(path)), quantization=quant)

    @classmethod
    def from_dict(cls, raw: dict, extra_eos: tuple[int, ...] = ()) -> "ModelConfig":
        architecture = (raw.get("architectures") or ["?"])[0]
        if architecture in MULTIMODAL:
            raw = language_model_config(raw)
        family = registry.family(architecture)
        if family == "gemma4":
            raw = gemma4_defaults(raw)
        gemma = GemmaConfig.from_dict(raw, family)
        if gemma is None and raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; only silu")
        if raw.get("mlp_bias"):
            raise ValueError("mlp_bias is not supported")
        num_heads = raw["num_attention_heads"]
        num_kv_heads = raw.get("num_key_value_heads") or num_heads
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        shapes = gemma4_kv_shapes(raw, num_kv_heads, head_dim) if family == "gemma4" else ()
        sliding = raw.get("sliding_window")
        if family == "qwen2" and not raw.get("use_sliding_window", False):
            sliding = None
        windows: tuple[int | None, ...] = ()
        if family in PER_LAYER_WINDOWS:
            windows = _layer_windows(raw, sliding)
            sliding = None
        elif sliding and family in GLOBAL_WINDOWS:
            windows = _layer_windows(
                {**raw, "layer_types": _global_layer_types(raw, family)}, sliding
            )
            sliding = None
        return cls(
            architecture=architecture,
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=(
                raw.get("intermediate_size", 0)
                if family in EXPERTS_ONLY
                else raw["intermediate_size"]
            ),
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rope=_rope(global_rope_config(raw) if gemma else raw),
            attention_bias=bool(raw.get(*BIAS_FIELDS.get(family, ("attention_bias", False)))),
            tie_word_embeddings=raw.get("tie_word_embeddings"),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
            eos_token_ids=tuple(dict.fromkeys(_as_tuple(raw.get("eos_token_id")) + extra_eos)),
            sliding_window=sliding,
            moe=MoEConfig.from_dict(raw, family),
            layer_windows=windows,
            gemma=gemma,
            linear_layers=_linear_layers(raw) if family in HYBRID_FAMILIES else (),
            gated_delta_net=_gated_delta_net(raw, family),
            kv_owners=kv_owners(raw) if family == "gemma4" else (),
            layer_kv_shapes=shapes if len(set(shapes)) > 1 else (),
        )


BIAS_FIELDS = {"qwen2_moe": ("qkv_bias", True)}
"""Families whose config.json turns the attention's bias on with another field than
``attention_bias`` → (that field, transformers' default). Qwen2-MoE's is on q/k/v only."""
EXPERTS_ONLY = ("qwen3_5_moe",)
"""Families whose every layer has the MoE block: config.json may name no dense
``intermediate_size`` (0 then; no layer reads it)."""
HYBRID_FAMILIES = {"qwen3_next": "qwen3_next", "qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_5"}
"""Families of Gated DeltaNet and full-attention layers → their DeltaNets' checkpoint layout."""


LINEAR_FIELDS = (
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim",
)  # fmt: skip


def _gated_delta_net(raw: dict, family: str) -> GatedDeltaNetConfig | None:
    """A ``HYBRID_FAMILIES`` model's Gated DeltaNet shape; a ValueError naming the
    ``linear_*`` fields config.json lacks."""
    if family not in HYBRID_FAMILIES:
        return None
    missing = [name for name in LINEAR_FIELDS if name not in raw]
    if missing:
        raise ValueError(f"config.json of a {family} model lacks {', '.join(missing)}")
    return GatedDeltaNetConfig.from_hf(SimpleNamespace(**raw), HYBRID_FAMILIES[family])


def _linear_layers(raw: dict) -> tuple[int, ...]:
    """``layer_types``, or transformers' default: every ``full_attention_interval``-th layer
    full attention, the rest linear."""
    count, interval = raw["num_hidden_layers"], raw.get("full_attention_interval", 4)
    default = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(count)
    ]
    types = raw.get("layer_types") or default
    kinds = ("full_attention", "linear_attention")
    if not isinstance(types, list) or len(types) != count or not set(types) <= set(kinds):
        raise ValueError(
            f"layer_types must list one of {kinds} for each of the {count} layers "
            f"(num_hidden_layers), got {types!r}"
        )
    return tuple(i for i, kind in enumerate(types) if kind == "linear_attention")


PER_LAYER_WINDOWS = ("gpt_oss", *GEMMA_FAMILIES)
"""Families whose ``layer_types`` give each layer full or sliding-window attention."""
LAYER_TYPES = ("full_attention", "sliding_attention")


GLOBAL_WINDOWS = ("mistral", "qwen2")
"""Families whose one ``sliding_window`` is every layer's (Mistral), or, with
``use_sliding_window``, that of the layers from ``max_window_layers`` on (Qwen2)."""


def _global_layer_types(raw: dict, family: str) -> list[str]:
    """``layer_types`` as transformers derives them for a ``GLOBAL_WINDOWS`` family."""
    count = raw["num_hidden_layers"]
    if "layer_types" in raw:
        return raw["layer_types"]
    first = raw.get("max_window_layers", 28) if family == "qwen2" else 0
    return ["sliding_attention" if i >= first else "full_attention" for i in range(count)]


def _layer_windows(raw: dict, sliding: int | None) -> tuple[int | None, ...]:
    """Without ``layer_types``, transformers' default for gpt-oss: sliding, full, sliding..."""
    layers = raw["num_hidden_layers"]
    default = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    types = raw.get("layer_types") or default
    if not isinstance(types, list) or len(types) != layers:
        raise ValueError(
            f"layer_types must list one of {LAYER_TYPES} for each of the "
            f"{raw['num_hidden_layers']} layers (num_hidden_layers), got {types!r}"
        )
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"unsupported layer_types {unknown}; supported: {LAYER_TYPES}")
    if "sliding_attention" in types and not (isinstance(sliding, int) and sliding > 0):
        raise ValueError(
            f"sliding_attention layers need a positive sliding_window, got {sliding!r}"
        )
    return tuple(sliding if t == "sliding_attention" else None for t in types)


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def _generation_eos(path: Path) -> tuple[int, ...]:
    gen = path / "generation_config.json"
    if not gen.is_file():
        return ()
    return _as_tuple(json.loads(gen.read_text()).get("eos_token_id"))


def _rope(raw: dict) -> RopeConfig:
    """``_rope_type``'s frequencies, turning ``partial_rotary_factor`` of each head (config.json
    gives it in ``rope_parameters`` or at the top level; proportional RoPE reads its own)."""
    params = {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}
    if params.get("rope_type") == "proportional":
        return _rope_type(raw)
    factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if not 0 < factor <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {factor!r}")
    return dataclasses.replace(_rope_type(raw), partial_rotary_factor=factor)


def _rope_type(raw: dict) -> RopeConfig:
    """Reads both spellings: transformers 5's ``rope_parameters`` and the older
    top-level ``rope_theta`` with an optional ``rope_scaling``; a missing
    ``original_max_position_embeddings`` is the top-level one (Phi-3's spelling), then
    ``max_position_embeddings``, as transformers fills it in."""
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if rope_type == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=_rope_param(params, "factor"))
    if rope_type == "proportional":
        share = params.get("partial_rotary_factor", 1.0)
        if not 0.0 <= share <= 1.0:
            raise ValueError(
                f"rope_parameters.partial_rotary_factor must be in [0, 1], got {share}"
            )
        return RopeConfig(
            theta=theta,
            rope_type="proportional",
            factor=params.get("factor", 1.0),
            partial_rotary_factor=share,
        )
    max_positions = raw.get("max_position_embeddings", 2048)
    original = raw.get(
        "original_max_position_embeddings",
        params.get("original_max_position_embeddings", max_positions),
    )
    if rope_type == "llama3":
        return RopeConfig(
            theta=theta,
            rope_type="llama3",
            factor=_rope_param(params, "factor"),
            low_freq_factor=_rope_param(params, "low_freq_factor"),
            high_freq_factor=_rope_param(params, "high_freq_factor"),
            original_max_position_embeddings=original,
        )
    factor = params.get("factor") or max_positions / original
    if rope_type == "yarn":
        return RopeConfig(
            theta=theta,
            rope_type="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            beta_fast=params.get("beta_fast") or 32.0,
            beta_slow=params.get("beta_slow") or 1.0,
            truncate=params.get("truncate", True),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor=params.get("attention_factor"),
        )
    return RopeConfig(
        theta=theta,
        rope_type="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        attention_factor=params.get("attention_factor"),
        short_factor=tuple(_rope_param(params, "short_factor")),
        long_factor=tuple(_rope_param(params, "long_factor")),
    )


def _rope_param(params: dict, name: str):
    if params.get(name) is None:
        rope_type = params.get("rope_type", params.get("type"))
        raise ValueError(f"rope_parameters.{name} is required for rope_type {rope_type!r}")
    return params[name]
