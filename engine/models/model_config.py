"""The architecture facts the engine needs, read from a checkpoint's config.json."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from kvserve.engine.models import registry
from kvserve.engine.models.gguf_checkpoint import gguf_config, gguf_file
from kvserve.engine.quantization.config import QuantConfig, read_quant_config


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    tie_word_embeddings: bool | None  # None: decided by whether lm_head.weight exists
    torch_dtype: str | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    quantization: QuantConfig | None = None
    """The linear layers' quantization (``engine/quantization``); None: 16-bit."""

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
        family = registry.family(architecture)
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; only silu")
        if raw.get("mlp_bias"):
            raise ValueError("mlp_bias is not supported")
        num_heads = raw["num_attention_heads"]
        sliding = raw.get("sliding_window")
        if family == "qwen2" and not raw.get("use_sliding_window", False):
            sliding = None
        return cls(
            architecture=architecture,
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rope=_rope(raw),
            attention_bias=bool(raw.get("attention_bias", False)),
            tie_word_embeddings=raw.get("tie_word_embeddings"),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
            eos_token_ids=tuple(dict.fromkeys(_as_tuple(raw.get("eos_token_id")) + extra_eos)),
            sliding_window=sliding,
        )


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
    """Reads both spellings: transformers 5's ``rope_parameters`` and the older
    top-level ``rope_theta`` with an optional ``rope_scaling``."""
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, llama3")
    return RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=params["factor"],
        low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params["original_max_position_embeddings"],
    )
