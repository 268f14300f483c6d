"""The quantized checkpoint formats: for each, the tensors one linear becomes, the dtype of the
tensors left unquantized, and the config the quantizing tool writes.

A format quantizes the weight [N, K] (out, in) of one decoder-layer linear and returns its
tensors (named as in the checkpoint, without the module prefix) with the float32 weight they
mean, the reference checkpoint's weight.
"""

import json
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.config import CompressionFormat
from compressed_tensors.quantization import (
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStatus,
    preset_name_to_scheme,
)

from int4_packing import awq_tensors, gptq_tensors
from quant_math import FP8_MAX, expand_blocks, quantize_fp8, quantize_int4

MODELOPT_VERSION = "0.39.0"  # the producer version written into ModelOpt's configs

# Projections that read the same input: GPTQ's act order (the Hessian's diagonal, which depends
# on the input only) orders their columns alike.
INPUT_OF = {
    "self_attn.q_proj": "attention input",
    "self_attn.k_proj": "attention input",
    "self_attn.v_proj": "attention input",
    "self_attn.o_proj": "attention output",
    "mlp.gate_proj": "mlp input",
    "mlp.up_proj": "mlp input",
    "mlp.down_proj": "mlp activation",
}

Quantized = tuple[dict[str, torch.Tensor], torch.Tensor]


class QuantFormat(ABC):
    """One format with its options; ``quantize`` is called once per decoder-layer linear."""

    dtype: ClassVar[torch.dtype]  # of the tensors left unquantized (embeddings, norms, lm_head)

    @abstractmethod
    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        """The checkpoint tensors of ``weight`` (float32 [N, K]) and the weight they mean;
        ``input_absmax`` is the largest |input| the linear saw in calibration."""

    @abstractmethod
    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        """Write config.json, the model's ``config`` plus the format's quantization_config,
        and any side file the quantizing tool writes next to it."""


def write_config_json(
    directory: Path, config: dict[str, Any], quantization_config: dict[str, Any] | None = None
) -> None:
    """config.json: ``config``, with ``quantization_config`` where given."""
    if quantization_config is not None:
        config = {**config, "quantization_config": quantization_config}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def column_groups(columns: int, group_size: int) -> torch.Tensor:
    """Group index of each input column when groups are consecutive runs of ``group_size``."""
    if columns % group_size:
        raise ValueError(f"{columns} input columns do not split into groups of {group_size}")
    return torch.arange(columns) // group_size


@dataclass
class Awq(QuantFormat):
    """AutoAWQ, GEMM version: asymmetric 4-bit groups (layout in int4_packing)."""

    group_size: int = 128
    dtype: ClassVar[torch.dtype] = torch.float16

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        groups = quantize_int4(
            weight, column_groups(weight.shape[1], self.group_size), symmetric=False
        )
        return awq_tensors(groups), groups.dequantized()

    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        # AutoAWQ quantizes the decoder layers only and leaves modules_to_not_convert unset.
        write_config_json(
            directory,
            config,
            {
                "quant_method": "awq",
                "bits": 4,
                "group_size": self.group_size,
                "zero_point": True,
                "version": "gemm",
                "modules_to_not_convert": None,
            },
        )


@dataclass
class Gptq(QuantFormat):
    """AutoGPTQ's format (checkpoint_format "gptq", the v1 zero points; layout in int4_packing).

    With ``desc_act`` the input columns are quantized in a random order, one order per layer
    and input (q, k and v share one, gate and up another), and group i holds the columns
    ``perm[i*G:(i+1)*G]``: g_idx[perm[j]] = j // G. Without it g_idx[k] = k // G.
    """

    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    seed: int = 0
    dtype: ClassVar[torch.dtype] = torch.float16
    _orders: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, repr=False)

    def g_idx(self, layer: int, projection: str, columns: int) -> torch.Tensor:
        groups = column_groups(columns, self.group_size)
        if not self.desc_act:
            return groups
        key = (layer, INPUT_OF[projection])
        if key not in self._orders:
            seed = zlib.crc32(f"{self.seed} {layer} {key[1]}".encode())
            generator = torch.Generator().manual_seed(seed)
            self._orders[key] = torch.randperm(columns, generator=generator)
        g_idx = torch.empty_like(groups)
        g_idx[self._orders[key]] = groups
        return g_idx

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        g_idx = self.g_idx(layer, projection, weight.shape[1])
        groups = quantize_int4(weight, g_idx, symmetric=self.sym, min_zero=1)
        return gptq_tensors(groups), groups.dequantized()

    def quantization_config(self) -> dict[str, Any]:
        return {
            "bits": 4,
            "group_size": self.group_size,
            "damp_percent": 0.01,
            "desc_act": self.desc_act,
            "static_groups": False,
            "sym": self.sym,
            "true_sequential": True,
            "model_name_or_path": None,
            "model_file_base_name": "model",
            "quant_method": "gptq",
            "checkpoint_format": "gptq",
        }

    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        write_config_json(directory, config, self.quantization_config())
        # AutoGPTQ writes the same settings to quantize_config.json too.
        (directory / "quantize_config.json").write_text(
            json.dumps(self.quantization_config(), indent=2)
        )


class CompressedTensors(QuantFormat):
    """compressed-tensors as llm-compressor saves it: the package's own compressor packs each
    linear and its ModelCompressor writes the config (all Linear targeted, lm_head ignored)."""

    dtype: ClassVar[torch.dtype] = torch.bfloat16
    scheme: QuantizationScheme

    def compress(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        compressor = BaseCompressor.get_value_from_registry(
            CompressionFormat(self.scheme.format).value
        )
        return dict(compressor.compress(state, self.scheme))

    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        write_config_json(directory, config)
        quantization_config = QuantizationConfig(
            config_groups={"group_0": self.scheme},
            format=self.scheme.format,
            ignore=["lm_head"],
            quantization_status=QuantizationStatus.COMPRESSED,
        )
        ModelCompressor(quantization_config=quantization_config).update_config(str(directory))


class CompressedTensorsInt4(CompressedTensors):
    """``pack-quantized`` W4A16 (llm-compressor's W4A16 / W4A16_ASYM presets): per linear
    weight_packed int32 [N, K/8] (eight values of a row per word, nibble i = column 8c+i, each
    stored as value + 8), weight_scale bf16 [N, K/G], weight_shape int64 [2] and, asymmetric
    only, weight_zero_point int32 [N/8, K/G] (zero points + 8 packed down the rows)."""

    def __init__(self, group_size: int = 128, sym: bool = True) -> None:
        self.group_size = group_size
        self.sym = sym
        scheme = preset_name_to_scheme("W4A16" if sym else "W4A16_ASYM", ["Linear"])
        scheme.weights.group_size = group_size
        scheme.format = CompressionFormat.pack_quantized
        self.scheme = scheme

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        groups = quantize_int4(
            weight, column_groups(weight.shape[1], self.group_size), symmetric=self.sym
        )
        meant = groups.dequantized()
        state = {  # the weight given already rounded: the compressor's rounding is then exact
            "weight": meant.to(self.dtype),
            "weight_scale": groups.scale.to(self.dtype),
            "weight_zero_point": (groups.zero - 8).to(torch.int8),
        }
        return self.compress(state), meant


class CompressedTensorsFp8(CompressedTensors):
    """``float-quantized`` FP8 W8A8: weight float8_e4m3fn [N, K] and weight_scale bf16, [1] per
    tensor or [N, 1] per channel; with static activations input_scale bf16 [1]. Per-tensor
    weights with static activations are llm-compressor's FP8 preset, per-channel with dynamic
    per-token activations its FP8_DYNAMIC; the other two mix the presets' arguments."""

    def __init__(self, per_channel: bool = False, dynamic: bool = False) -> None:
        self.per_channel = per_channel
        self.dynamic = dynamic
        weights = preset_name_to_scheme("FP8_DYNAMIC" if per_channel else "FP8", ["Linear"])
        inputs = preset_name_to_scheme("FP8_DYNAMIC" if dynamic else "FP8", ["Linear"])
        self.scheme = QuantizationScheme(
            targets=["Linear"],
            weights=weights.weights,
            input_activations=inputs.input_activations,
            format=CompressionFormat.float_quantized,
        )

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        rows, cols = weight.shape
        block = (1, cols) if self.per_channel else (rows, cols)
        values, scale = quantize_fp8(weight, block)
        meant = values.float() * expand_blocks(scale, block, weight.shape)
        state = {
            "weight": meant.to(self.dtype),
            "weight_scale": (scale if self.per_channel else scale.reshape(1)).to(self.dtype),
        }
        if not self.dynamic:
            state["input_scale"] = torch.tensor([input_absmax / FP8_MAX], dtype=self.dtype)
        return self.compress(state), meant


@dataclass
class Fp8Block(QuantFormat):
    """transformers' fine-grained FP8 as DeepSeek-V3 and Qwen3-*-FP8 ship it: weight
    float8_e4m3fn [N, K] and weight_scale_inv [ceil(N/bn), ceil(K/bk)], the weight being the
    FP8 value times its block's weight_scale_inv; activations dynamic. The scales are float32
    in DeepSeek-V3, bfloat16 in Qwen3's FP8 releases (``scale_dtype``)."""

    weight_block_size: tuple[int, int] = (128, 128)
    scale_dtype: torch.dtype = torch.float32
    dtype: ClassVar[torch.dtype] = torch.bfloat16

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        values, scale = quantize_fp8(weight, self.weight_block_size)
        meant = values.float() * expand_blocks(scale, self.weight_block_size, weight.shape)
        return {"weight": values, "weight_scale_inv": scale.to(self.scale_dtype)}, meant

    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        write_config_json(
            directory,
            config,
            {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "weight_block_size": list(self.weight_block_size),
                "modules_to_not_convert": ["lm_head"],
            },
        )


@dataclass
class ModelOptFp8(QuantFormat):
    """NVIDIA ModelOpt's FP8 export: weight float8_e4m3fn [N, K], weight_scale and input_scale
    float32 scalars (shape []); hf_quant_config.json beside config.json, whose
    quantization_config is its llm-compressor-like conversion with quant_method "modelopt"."""

    dtype: ClassVar[torch.dtype] = torch.bfloat16

    def quantize(
        self, layer: int, projection: str, weight: torch.Tensor, input_absmax: float
    ) -> Quantized:
        rows, cols = weight.shape
        values, scale = quantize_fp8(weight, (rows, cols))
        tensors = {
            "weight": values,
            "weight_scale": scale.reshape(()),
            "input_scale": torch.tensor(input_absmax / FP8_MAX, dtype=torch.float32),
        }
        return tensors, values.float() * scale

    def hf_quant_config(self) -> dict[str, Any]:
        return {
            "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
            "quantization": {
                "quant_algo": "FP8",
                "kv_cache_quant_algo": None,
                "exclude_modules": ["lm_head"],
            },
        }

    def quantization_config(self) -> dict[str, Any]:
        fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
        return {
            "config_groups": {
                "group_0": {"input_activations": fp8, "weights": fp8, "targets": ["Linear"]}
            },
            "ignore": ["lm_head"],
            "quant_algo": "FP8",
            "producer": self.hf_quant_config()["producer"],
            "quant_method": "modelopt",
        }

    def write_config(self, directory: Path, config: dict[str, Any]) -> None:
        write_config_json(directory, config, self.quantization_config())
        (directory / "hf_quant_config.json").write_text(
            json.dumps(self.hf_quant_config(), indent=4)
        )


FORMATS: dict[str, type[QuantFormat]] = {
    "awq": Awq,
    "gptq": Gptq,
    "compressed-tensors-int4": CompressedTensorsInt4,
    "compressed-tensors-fp8": CompressedTensorsFp8,
    "fp8": Fp8Block,
    "modelopt-fp8": ModelOptFp8,
}
