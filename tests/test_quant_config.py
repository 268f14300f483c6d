"""Which quantizations a checkpoint may declare, what the plan line calls them, and the
exact refusal of everything else, before any weight loads."""

import json
from pathlib import Path

import pytest

from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.quantization.config import (
    SUPPORTED,
    Fp8Scheme,
    Int4Scheme,
    QuantConfig,
    read_quant_config,
)


def _fp8_group(weights: str, acts: dict | None, **extra) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": weights, **extra},
                "input_activations": acts,
            }
        },
    }


DYNAMIC = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
STATIC = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}


@pytest.mark.parametrize(
    ("quant", "described"),
    [
        (
            _fp8_group("channel", DYNAMIC),
            "fp8 per-channel, activations fp8 dynamic (compressed-tensors)",
        ),
        (
            _fp8_group("tensor", STATIC),
            "fp8 per-tensor, activations fp8 static (compressed-tensors)",
        ),
        (
            _fp8_group(
                "block",
                {"num_bits": 8, "type": "float", "strategy": "group", "dynamic": True},
                block_structure=[128, 128],
            ),
            "fp8 128x128 blocks, activations fp8 dynamic (compressed-tensors)",
        ),
        (
            {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
            },
            "fp8 128x128 blocks, activations fp8 dynamic (fp8)",
        ),
        (
            {"quant_method": "modelopt", "quant_algo": "FP8"},
            "fp8 per-tensor, activations fp8 static (modelopt)",
        ),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"},
            "int4 groups of 64 (zero points), activations 16-bit (awq)",
        ),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": True},
            "int4 groups of 32 (symmetric, act-order), activations 16-bit (gptq)",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": W4}},
            },
            "int4 groups of 128 (symmetric), activations 16-bit (compressed-tensors)",
        ),
    ],
)
def test_supported_schemes_and_their_plan_names(tmp_path: Path, quant: dict, described: str):
    config = read_quant_config(tmp_path, {"quantization_config": quant}, None)
    assert config is not None and config.describe() == described


def test_block_fp8_reads_weight_scale_inv_and_gptq_v1_zeros_are_offset(tmp_path: Path):
    block = {"quant_method": "fp8", "weight_block_size": [128, 64]}
    assert read_quant_config(tmp_path, {"quantization_config": block}, None) == QuantConfig(
        "fp8", Fp8Scheme("block", "dynamic", (128, 64), "weight_scale_inv")
    )
    v1 = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    v2 = {**v1, "checkpoint_format": "gptq_v2"}
    assert read_quant_config(tmp_path, {"quantization_config": v1}, None) == QuantConfig(
        "gptq", Int4Scheme("gptq", 128, symmetric=True, zero_offset=1)
    )
    got = read_quant_config(tmp_path, {"quantization_config": v2}, None)
    assert got is not None and got.scheme == Int4Scheme("gptq", 128, symmetric=True)


def test_modelopt_config_may_come_from_hf_quant_config_json(tmp_path: Path):
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}})
    )
    assert read_quant_config(tmp_path, {}, None) == QuantConfig(
        "modelopt", Fp8Scheme("tensor", "static"), ("lm_head",)
    )


def test_quantization_flag_on_a_16_bit_checkpoint_and_on_a_quantized_one(tmp_path: Path):
    assert read_quant_config(tmp_path, {}, None) is None
    assert read_quant_config(tmp_path, {}, "fp8") == QuantConfig(
        "fp8", Fp8Scheme("channel", "dynamic", at_load=True)
    )
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    with pytest.raises(ValueError) as err:
        read_quant_config(tmp_path, {"quantization_config": awq}, "fp8")
    assert str(err.value) == (
        "--quantization fp8 asks to quantize a checkpoint that is already quantized (awq); "
        "leave --quantization out"
    )


@pytest.mark.parametrize(
    ("quant", "reason"),
    [
        ({"quant_method": "bitsandbytes"}, "unsupported quantization_config.quant_method "),
        (
            {"quant_method": "gptq", "bits": 8, "group_size": 128},
            "unsupported gptq checkpoint: 8-bit weights",
        ),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 256},
            "unsupported awq checkpoint: group_size 256 (4-bit groups of (32, 64, 128) are)",
        ),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"},
            "unsupported awq checkpoint: version 'gemv' (gemm is)",
        ),
        (
            {"quant_method": "modelopt", "quant_algo": "NVFP4"},
            "unsupported modelopt checkpoint: quant_algo 'NVFP4' (FP8 is)",
        ),
        (
            _fp8_group("channel", None),
            "unsupported compressed-tensors checkpoint: FP8 weights with 16-bit activations "
            "(W8A16)",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "group_0": {"targets": ["Linear"], "weights": {**W4, "actorder": "weight"}}
                },
            },
            "unsupported compressed-tensors checkpoint: actorder 'weight' (none or group is)",
        ),
    ],
)
def test_unsupported_schemes_are_refused_naming_them(tmp_path: Path, quant: dict, reason: str):
    with pytest.raises(ValueError) as err:
        read_quant_config(tmp_path, {"quantization_config": quant}, None)
    message = str(err.value)
    assert message.startswith(reason)
    assert message.endswith(f"supported: {SUPPORTED}")
    if quant["quant_method"] == "bitsandbytes":
        assert message == (
            f"unsupported quantization_config.quant_method 'bitsandbytes'; supported: {SUPPORTED}"
        )


def test_a_fused_layer_must_be_quantized_whole(tmp_path: Path):
    config = QuantConfig("fp8", Fp8Scheme("tensor", "static"), ("re:.*k_proj",))
    names = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    with pytest.raises(ValueError) as err:
        config.quantizes(names)
    assert str(err.value) == (
        f"fp8 checkpoint quantizes some of {', '.join(names)} but not all; they run as one "
        "fused layer"
    )
    assert not config.quantizes(["model.layers.0.self_attn.k_proj"])
    assert config.quantizes(["model.layers.0.mlp.down_proj"])


def test_an_unsupported_checkpoint_is_refused_when_its_config_is_read(checkpoint, tmp_path):
    raw = json.loads((checkpoint("llama") / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "hqq"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"unsupported quantization_config\.quant_method 'hqq'"):
        ModelConfig.from_dir(tmp_path)
