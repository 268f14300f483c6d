"""Every RoPE type reads from config.json and turns q/k as transformers 5 does: the cos/sin
table equals transformers' rotary embedding (its rope init functions) for each type."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.models.model_config import ModelConfig

HEAD_DIM = 16
MAX_POSITIONS = 256

ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    # gpt-oss's own parameters (truncate false), then DeepSeek's mscale pair.
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 64,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "attention_factor": 1.25,
        "beta_fast": 16.0,
        "original_max_position_embeddings": 128,
    },
    # Gemma 4's global layers: a quarter of the pairs rotate, the rest keep frequency 0
    "proportional": {
        "rope_type": "proportional",
        "rope_theta": 1_000_000.0,
        "partial_rotary_factor": 0.25,
        "factor": 2.0,
    },
}


def _raw(rope_parameters: dict, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 8,
        "hidden_size": 64,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "rope_parameters": dict(rope_parameters),
        **extra,
    }


def _configs(rope_parameters: dict, **extra) -> tuple[LlamaConfig, ModelConfig]:
    raw = _raw(rope_parameters, **extra)
    return LlamaConfig(**raw), ModelConfig.from_dict(raw)


def _table(cfg: ModelConfig) -> torch.Tensor:
    rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, MAX_POSITIONS)
    rotary.build(torch.float32, torch.device("cpu"))
    return rotary.cos_sin


def _hf_table(hf: LlamaConfig, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), positions[None])
    return torch.stack([cos[0], sin[0]])


@pytest.mark.parametrize("name", sorted(ROPE_PARAMETERS))
def test_cos_sin_table_equals_transformers(name):
    hf, cfg = _configs(ROPE_PARAMETERS[name])
    assert cfg.rope.rope_type == ROPE_PARAMETERS[name]["rope_type"]
    torch.testing.assert_close(
        _table(cfg), _hf_table(hf, torch.arange(MAX_POSITIONS)), rtol=0, atol=1e-8
    )


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    _, cfg = _configs(ROPE_PARAMETERS["yarn"])
    assert _table(cfg)[0, 0, 0].item() == pytest.approx(0.1 * torch.log(torch.tensor(32.0)) + 1)


def test_longrope_turns_short_before_the_original_length_and_long_from_it():
    short = [1.0 + i / 8 for i in range(HEAD_DIM // 2)]
    long = [2.0 + i for i in range(HEAD_DIM // 2)]
    params = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    hf, cfg = _configs(params, original_max_position_embeddings=64)
    assert (cfg.rope.original_max_position_embeddings, cfg.rope.factor) == (64, 4.0)
    table = _table(cfg)
    torch.testing.assert_close(table[:, :64], _hf_table(hf, torch.arange(64)), rtol=0, atol=1e-8)
    torch.testing.assert_close(
        table[:, 64:], _hf_table(hf, torch.arange(MAX_POSITIONS))[:, 64:], rtol=0, atol=1e-8
    )


def test_old_rope_scaling_spelling_reads_as_rope_parameters():
    _, new = _configs(ROPE_PARAMETERS["yarn"])
    old_raw = _raw({}, rope_theta=150000.0)
    del old_raw["rope_parameters"]
    old_raw["rope_scaling"] = {
        k: v for k, v in ROPE_PARAMETERS["yarn"].items() if k != "rope_theta"
    }
    assert ModelConfig.from_dict(old_raw).rope == new.rope


def test_unknown_rope_type_names_the_supported_ones():
    with pytest.raises(ValueError) as err:
        _configs({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert str(err.value) == (
        "unsupported rope_type 'dynamic'; supported: default, linear, llama3, yarn, longrope, "
        "proportional"
    )


def test_missing_rope_parameter_is_named():
    raw = _raw({"rope_type": "linear", "rope_theta": 10000.0})
    with pytest.raises(
        ValueError, match=r"^rope_parameters.factor is required for rope_type 'linear'$"
    ):
        ModelConfig.from_dict(raw)


def test_longrope_factors_of_the_wrong_length_are_named():
    params = {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}
    with pytest.raises(ValueError, match=r"short_factor has 3 values; head_dim 16 needs 8"):
        _table(ModelConfig.from_dict(_raw(params)))
