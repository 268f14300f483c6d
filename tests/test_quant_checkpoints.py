"""The quantized checkpoint writers, proved without the engine: each checkpoint, decoded by the
format's own rules (written here from the specifications, bit by bit) or by the
compressed-tensors package itself, gives exactly its reference's weights, and the reference
loads in transformers."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

from int4_packing import AWQ_ORDER, gptq_tensors, pack_nibbles
from quant_checkpoints import (
    QUANT_FAMILIES,
    QUANT_SHAPE,
    QuantizedCheckpoint,
    build_quant_source,
    write_quantized,
)
from quant_math import Int4Groups, coarse_scale

LINEARS = [
    f"model.layers.{layer}.{projection}"
    for layer in range(QUANT_SHAPE["num_hidden_layers"])
    for projection in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
]
# Readers unpack an AWQ word's eight columns from these nibbles (column j from nibble
# AWQ_UNPACK[j]), the inverse of the packing order.
AWQ_UNPACK = (0, 4, 1, 5, 2, 6, 3, 7)
QUANT_METHOD = {
    "awq": "awq",
    "gptq": "gptq",
    "compressed-tensors-int4": "compressed-tensors",
    "compressed-tensors-fp8": "compressed-tensors",
    "fp8": "fp8",
    "modelopt-fp8": "modelopt",
}

# (family, format, options): every format and option, the families alternating.
Case = tuple[str, str, dict[str, Any]]
CASES: list[Case] = [
    ("llama", "awq", {}),
    ("qwen3", "awq", {"group_size": 32}),
    ("llama", "gptq", {}),
    ("qwen3", "gptq", {"group_size": 64, "sym": False}),
    ("llama", "gptq", {"desc_act": True}),
    ("qwen3", "gptq", {"group_size": 32, "sym": False, "desc_act": True}),
    ("llama", "compressed-tensors-int4", {}),
    ("qwen3", "compressed-tensors-int4", {"group_size": 32, "sym": False}),
    ("qwen3", "compressed-tensors-int4", {"group_size": 64}),
    ("llama", "compressed-tensors-fp8", {}),
    ("qwen3", "compressed-tensors-fp8", {"per_channel": True, "dynamic": True}),
    ("llama", "compressed-tensors-fp8", {"dynamic": True}),
    ("qwen3", "compressed-tensors-fp8", {"per_channel": True}),
    ("llama", "fp8", {}),
    ("qwen3", "fp8", {"scale_dtype": torch.bfloat16}),
    ("llama", "modelopt-fp8", {}),
]


def case_id(case: Case) -> str:
    family, fmt, options = case
    return "-".join([family, fmt, *(f"{k}={v}" for k, v in options.items())])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """``source(family)`` → the bfloat16 checkpoint of ``family`` (built once)."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_quant_source(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


@pytest.fixture(scope="module")
def written(source, tmp_path_factory):
    """``written(case)`` → the checkpoint of one CASES entry (written once)."""
    done: dict[str, QuantizedCheckpoint] = {}

    def get(case: Case) -> QuantizedCheckpoint:
        name = case_id(case)
        if name not in done:
            family, fmt, options = case
            dst = tmp_path_factory.mktemp("quantized") / name
            done[name] = write_quantized(source(family), dst, fmt, **options)
        return done[name]

    return get


def cases(fmt: str) -> list:
    return [pytest.param(c, id=case_id(c)) for c in CASES if c[1] == fmt]


def nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] → [..., W, 8]: nibble i is bits 4i..4i+3 of its word."""
    return (words.long().unsqueeze(-1) >> (4 * torch.arange(8))) & 0xF


def decode_awq(t: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """AutoAWQ GEMM → weight [N, K]: qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]."""
    q = nibbles(t[f"{module}.qweight"])[..., AWQ_UNPACK].flatten(1)  # [K, N]
    zero = nibbles(t[f"{module}.qzeros"])[..., AWQ_UNPACK].flatten(1)
    scales = t[f"{module}.scales"]
    g_idx = torch.arange(q.shape[0]) // (q.shape[0] // scales.shape[0])
    return ((q - zero[g_idx]) * scales.float()[g_idx]).T


def decode_gptq(t: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """AutoGPTQ → weight [N, K]: qweight [K/8, N] packed down the input columns, qzeros
    [K/G, N/8] holding zero - 1, scales [K/G, N], g_idx [K]."""
    words = t[f"{module}.qweight"]
    q = nibbles(words).permute(0, 2, 1).reshape(-1, words.shape[1])  # [K, N]
    zero = nibbles(t[f"{module}.qzeros"]).flatten(1) + 1
    g_idx = t[f"{module}.g_idx"].long()
    scales = t[f"{module}.scales"].float()
    return ((q - zero[g_idx]) * scales[g_idx]).T


def decode_pack_quantized(t: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """compressed-tensors pack-quantized → weight [N, K]: weight_packed [N, K/8] (column 8c+i
    in nibble i of word c, stored + 8), weight_scale [N, K/G], asymmetric weight_zero_point
    [N/8, K/G] (row 8r+i in nibble i of word r, stored + 8)."""
    q = nibbles(t[f"{module}.weight_packed"]).flatten(1) - 8
    scale = t[f"{module}.weight_scale"].float()
    zero = torch.zeros_like(scale)
    if f"{module}.weight_zero_point" in t:
        packed = t[f"{module}.weight_zero_point"]
        zero = nibbles(packed).permute(0, 2, 1).reshape(-1, packed.shape[1]) - 8
    g_idx = torch.arange(q.shape[1]) // (q.shape[1] // scale.shape[1])
    return (q - zero[:, g_idx]) * scale[:, g_idx]


def decode_block_fp8(t: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """weight float8_e4m3fn [N, K] times weight_scale_inv [ceil(N/128), ceil(K/128)]."""
    weight = t[f"{module}.weight"]
    rows, cols = torch.arange(weight.shape[0]) // 128, torch.arange(weight.shape[1]) // 128
    return weight.float() * t[f"{module}.weight_scale_inv"].float()[rows][:, cols]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def config(path: Path, name: str = "config.json") -> dict:
    return json.loads((path / name).read_text())


def test_coarse_scale_rounds_up_to_four_significant_bits():
    scales = coarse_scale(torch.tensor([1.0, 1.0625, 0.3, 15.5]))
    assert scales.tolist() == [1.0, 1.125, 0.3125, 16.0]


def test_awq_word_holds_its_eight_columns_in_awq_order():
    columns = torch.arange(1, 9).reshape(1, 8)
    word = pack_nibbles(columns, AWQ_ORDER)
    # nibbles 0..7 hold columns 0, 2, 4, 6, 1, 3, 5, 7: the values 1 3 5 7 2 4 6 8
    assert word.tolist() == [[0x86427531 - 2**32]]
    assert nibbles(word)[..., AWQ_UNPACK].flatten(1).tolist() == columns.tolist()


def test_gptq_packs_input_columns_down_and_zero_points_minus_one():
    q = torch.stack([torch.arange(1, 9), torch.arange(15, 7, -1)] * 4)  # [N=8, K=8]
    groups = Int4Groups(
        q=q,
        scale=torch.ones(8, 1),
        zero=torch.tensor([[8]] * 4 + [[1]] * 4),
        g_idx=torch.zeros(8, dtype=torch.long),
    )
    packed = gptq_tensors(groups)
    assert packed["qweight"].tolist() == [[0x87654321 - 2**32, 0x89ABCDEF - 2**32] * 4]
    assert packed["qzeros"].tolist() == [[0x00007777]]  # 8 - 1 for rows 0-3, 1 - 1 for 4-7
    assert packed["g_idx"].dtype == torch.int32


def test_gptq_v1_refuses_a_zero_point_of_zero():
    groups = Int4Groups(
        q=torch.zeros(8, 8, dtype=torch.long),
        scale=torch.ones(8, 1),
        zero=torch.zeros(8, 1, dtype=torch.long),
        g_idx=torch.zeros(8, dtype=torch.long),
    )
    with pytest.raises(ValueError, match="zero - 1"):
        gptq_tensors(groups)


@pytest.mark.parametrize("family", QUANT_FAMILIES)
def test_quant_shape_splits_into_whole_128_blocks_over_two_ranks(source, family):
    weights = tensors(source(family))
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (512, 256)
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    for module in LINEARS:
        rows, cols = weights[f"{module}.weight"].shape
        split_rows, split_cols = (
            (rows, cols // 2) if module.endswith(("o_proj", "down_proj")) else (rows // 2, cols)
        )
        assert split_rows % 128 == 0 and split_cols % 128 == 0, module


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_loads_in_transformers_with_the_meant_weights(source, written, case):
    family, fmt, _ = case
    checkpoint = written(case)
    reference = tensors(checkpoint.reference)
    model = AutoModelForCausalLM.from_pretrained(checkpoint.reference, dtype=torch.float32)
    loaded = model.state_dict()
    assert loaded.keys() == reference.keys()
    for name, weight in reference.items():
        assert weight.dtype == torch.float32, name
        assert torch.equal(loaded[name], weight), name
        assert torch.equal(weight.bfloat16().float(), weight), name  # exact in bf16 too
    quantized = tensors(checkpoint.path)
    original = tensors(source(family))
    for name, weight in original.items():
        if name.removesuffix(".weight") in LINEARS:  # quantization error, not garbage
            error = (reference[name] - weight.float()).norm() / weight.float().norm()
            assert 0 < error < (0.12 if "int4" in fmt or fmt in ("awq", "gptq") else 0.05), name
        else:  # kept in the checkpoint's dtype, the same values in the reference
            assert torch.equal(reference[name], quantized[name].float()), name
    assert AutoTokenizer.from_pretrained(checkpoint.path).encode("def f():") == (
        AutoTokenizer.from_pretrained(source(family)).encode("def f():")
    )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_config_is_the_source_config_with_the_format_dtype_and_quantization(source, written, case):
    family, fmt, _ = case
    written_config = config(written(case).path)
    dtype = "float16" if fmt in ("awq", "gptq") else "bfloat16"
    assert written_config.pop("quantization_config")["quant_method"] == QUANT_METHOD[fmt]
    assert written_config == {**config(source(family)), "dtype": dtype}
    assert config(written(case).reference) == {**config(source(family)), "dtype": "float32"}


@pytest.mark.parametrize("case", cases("awq"), ids=case_id)
def test_awq_decodes_to_the_reference(written, case):
    checkpoint = written(case)
    group_size = case[2].get("group_size", 128)
    assert config(checkpoint.path)["quantization_config"] == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        rows, cols = reference[f"{module}.weight"].shape
        assert quantized[f"{module}.qweight"].shape == (cols, rows // 8)
        assert quantized[f"{module}.qzeros"].shape == (cols // group_size, rows // 8)
        assert quantized[f"{module}.scales"].shape == (cols // group_size, rows)
        assert quantized[f"{module}.scales"].dtype == torch.float16
        assert torch.equal(decode_awq(quantized, module), reference[f"{module}.weight"]), module
    assert not any(name.startswith("lm_head.q") for name in quantized)


@pytest.mark.parametrize("case", cases("gptq"), ids=case_id)
def test_gptq_decodes_to_the_reference(written, case):
    checkpoint = written(case)
    options = {"group_size": 128, "sym": True, "desc_act": False, **case[2]}
    settings = {
        "bits": 4,
        "group_size": options["group_size"],
        "damp_percent": 0.01,
        "desc_act": options["desc_act"],
        "static_groups": False,
        "sym": options["sym"],
        "true_sequential": True,
        "model_name_or_path": None,
        "model_file_base_name": "model",
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
    }
    assert config(checkpoint.path)["quantization_config"] == settings
    assert config(checkpoint.path, "quantize_config.json") == settings
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        rows, cols = reference[f"{module}.weight"].shape
        groups = cols // options["group_size"]
        assert quantized[f"{module}.qweight"].shape == (cols // 8, rows)
        assert quantized[f"{module}.qzeros"].shape == (groups, rows // 8)
        assert quantized[f"{module}.scales"].shape == (groups, rows)
        assert quantized[f"{module}.g_idx"].dtype == torch.int32
        assert torch.equal(decode_gptq(quantized, module), reference[f"{module}.weight"]), module
        if options["sym"]:  # GPTQ's symmetric zero point 8, stored as 7 in every nibble
            assert (quantized[f"{module}.qzeros"] == 0x77777777).all()


@pytest.mark.parametrize("case", cases("gptq"), ids=case_id)
def test_gptq_groups_follow_act_order_shared_by_projections_of_one_input(written, case):
    quantized = tensors(written(case).path)
    group_size = case[2].get("group_size", 128)
    g_idx = {module: quantized[f"{module}.g_idx"].long() for module in LINEARS}
    for module, groups in g_idx.items():
        assert (torch.bincount(groups) == group_size).all(), module
        in_order = torch.equal(groups, torch.arange(len(groups)) // group_size)
        assert in_order != case[2].get("desc_act", False), module
    if not case[2].get("desc_act"):
        return
    for layer in ("model.layers.0", "model.layers.1"):
        attention, mlp = f"{layer}.self_attn", f"{layer}.mlp"
        assert torch.equal(g_idx[f"{attention}.q_proj"], g_idx[f"{attention}.k_proj"])
        assert torch.equal(g_idx[f"{attention}.q_proj"], g_idx[f"{attention}.v_proj"])
        assert torch.equal(g_idx[f"{mlp}.gate_proj"], g_idx[f"{mlp}.up_proj"])
        assert not torch.equal(g_idx[f"{attention}.q_proj"], g_idx[f"{attention}.o_proj"])
    first, second = (g_idx[f"model.layers.{i}.mlp.gate_proj"] for i in (0, 1))
    assert not torch.equal(first, second)


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize(
    "case", cases("compressed-tensors-int4") + cases("compressed-tensors-fp8"), ids=case_id
)
def test_compressed_tensors_decompress_to_the_reference(written, case):
    """transformers' compressed-tensors loader, with the package's own decompressor."""
    checkpoint = written(case)
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint.path,
        dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(dequantize=True),
    )
    decompressed = model.state_dict()
    for name, weight in tensors(checkpoint.reference).items():
        assert torch.equal(decompressed[name].float(), weight), name


@pytest.mark.parametrize("case", cases("compressed-tensors-int4"), ids=case_id)
def test_pack_quantized_layout(written, case):
    checkpoint = written(case)
    options = {"group_size": 128, "sym": True, **case[2]}
    weights = {
        "dynamic": False,
        "group_size": options["group_size"],
        "num_bits": 4,
        "strategy": "group",
        "symmetric": options["sym"],
        "type": "int",
    }
    assert config(checkpoint.path)["quantization_config"] == compressed_tensors_config(
        "pack-quantized", weights, None
    )
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        rows, cols = reference[f"{module}.weight"].shape
        groups = cols // options["group_size"]
        assert quantized[f"{module}.weight_packed"].shape == (rows, cols // 8)
        assert quantized[f"{module}.weight_scale"].shape == (rows, groups)
        assert quantized[f"{module}.weight_scale"].dtype == torch.bfloat16
        assert quantized[f"{module}.weight_shape"].tolist() == [rows, cols]
        zero_point = quantized.get(f"{module}.weight_zero_point")
        assert (zero_point is None) == options["sym"]
        if zero_point is not None:
            assert zero_point.shape == (rows // 8, groups) and zero_point.dtype == torch.int32
        decoded = decode_pack_quantized(quantized, module)
        assert torch.equal(decoded, reference[f"{module}.weight"]), module


@pytest.mark.parametrize("case", cases("compressed-tensors-fp8"), ids=case_id)
def test_float_quantized_layout(written, case):
    checkpoint = written(case)
    per_channel, dynamic = case[2].get("per_channel", False), case[2].get("dynamic", False)
    weights = {
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "strategy": "channel" if per_channel else "tensor",
        "symmetric": True,
        "type": "float",
    }
    inputs = {
        "dynamic": dynamic,
        "group_size": None,
        "num_bits": 8,
        "strategy": "token" if dynamic else "tensor",
        "symmetric": True,
        "type": "float",
        **({} if dynamic else {"observer": "static_minmax"}),
    }
    assert config(checkpoint.path)["quantization_config"] == compressed_tensors_config(
        "float-quantized", weights, inputs
    )
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        weight, scale = quantized[f"{module}.weight"], quantized[f"{module}.weight_scale"]
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.bfloat16
        assert scale.shape == ((weight.shape[0], 1) if per_channel else (1,))
        assert torch.equal(weight.float() * scale.float(), reference[f"{module}.weight"])
        input_scale = quantized.get(f"{module}.input_scale")
        assert (input_scale is None) == dynamic
        if input_scale is not None:
            assert input_scale.shape == (1,) and input_scale.item() > 0


def compressed_tensors_config(fmt: str, weights: dict, inputs: dict | None) -> dict:
    """The quantization_config llm-compressor saves: one group over every Linear."""
    return {
        "config_groups": {
            "group_0": {
                "format": fmt,
                "input_activations": inputs,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "moe_sparsity_config": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.20.1",
    }


@pytest.mark.parametrize("case", cases("fp8"), ids=case_id)
def test_block_fp8_decodes_to_the_reference(written, case):
    checkpoint = written(case)
    assert config(checkpoint.path)["quantization_config"] == {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head"],
    }
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        weight, scale = quantized[f"{module}.weight"], quantized[f"{module}.weight_scale_inv"]
        assert weight.dtype == torch.float8_e4m3fn
        assert scale.dtype == case[2].get("scale_dtype", torch.float32)
        assert scale.shape == (weight.shape[0] // 128, weight.shape[1] // 128)
        decoded = decode_block_fp8(quantized, module)
        assert torch.equal(decoded, reference[f"{module}.weight"]), module
    assert quantized["lm_head.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("case", cases("modelopt-fp8"), ids=case_id)
def test_modelopt_fp8_decodes_to_the_reference(written, case):
    checkpoint = written(case)
    producer = {"name": "modelopt", "version": "0.39.0"}
    assert config(checkpoint.path, "hf_quant_config.json") == {
        "producer": producer,
        "quantization": {
            "quant_algo": "FP8",
            "kv_cache_quant_algo": None,
            "exclude_modules": ["lm_head"],
        },
    }
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    assert config(checkpoint.path)["quantization_config"] == {
        "config_groups": {
            "group_0": {"input_activations": fp8, "weights": fp8, "targets": ["Linear"]}
        },
        "ignore": ["lm_head"],
        "quant_algo": "FP8",
        "producer": producer,
        "quant_method": "modelopt",
    }
    quantized, reference = tensors(checkpoint.path), tensors(checkpoint.reference)
    for module in LINEARS:
        weight = quantized[f"{module}.weight"]
        scale, input_scale = (quantized[f"{module}.{s}"] for s in ("weight_scale", "input_scale"))
        assert weight.dtype == torch.float8_e4m3fn
        assert scale.shape == input_scale.shape == ()
        assert scale.dtype == input_scale.dtype == torch.float32
        assert input_scale.item() > 0
        assert torch.equal(weight.float() * scale, reference[f"{module}.weight"]), module
