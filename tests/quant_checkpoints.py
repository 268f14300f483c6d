"""Quantized checkpoints built on the spot, in the real on-disk formats, from a tiny 16-bit model,
each with its reference: the same model in float32 whose decoder-layer linears hold exactly
the weights the quantized checkpoint means (its dequantized weights), for transformers to run
as the ground truth.

The shape (``QUANT_SHAPE``) lets 128-wide groups and 128x128 blocks split evenly over two
tensor-parallel ranks: per rank, column-parallel rows (q 256, k/v 128, gate/up 256) and
row-parallel columns (o 256, down 256) are multiples of 128.
"""

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from checkpoints import CHAT_TEMPLATE, build_checkpoint
from quant_formats import FORMATS, write_config_json

QUANT_SHAPE = dict(
    hidden_size=256,
    num_attention_heads=4,
    head_dim=128,  # q_proj has 512 rows
    num_key_value_heads=2,
    intermediate_size=512,
    num_hidden_layers=2,
)
QUANT_FAMILIES = ("llama", "qwen3")
SOURCE_DTYPE = torch.bfloat16
WEIGHTS = "model.safetensors"
LINEAR = re.compile(r"(model\.layers\.(\d+)\.((?:self_attn|mlp)\.\w+_proj))\.weight")
CALIBRATION_TOKENS = 64


@dataclass(frozen=True)
class QuantizedCheckpoint:
    path: Path  # the quantized model directory
    reference: Path  # float32, the weights ``path`` means; transformers loads it


def build_quant_source(family: str, path: Path, seed: int = 0) -> Path:
    """A ``family`` checkpoint of ``QUANT_SHAPE`` in bfloat16 at ``path``, the model a
    quantizing tool would start from."""
    build_checkpoint(family, path, seed, CHAT_TEMPLATE, **QUANT_SHAPE)
    tensors = load_file(path / WEIGHTS)
    save_file({k: v.to(SOURCE_DTYPE) for k, v in tensors.items()}, path / WEIGHTS, {"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    write_config_json(path, {**config, "dtype": "bfloat16"})
    return path


def write_quantized(src: Path, dst: Path, fmt: str, **options: Any) -> QuantizedCheckpoint:
    """Quantize every decoder-layer linear (q/k/v/o, gate/up/down) of the checkpoint at ``src``
    into format ``fmt`` and write the model directory ``dst`` (config.json, tokenizer files,
    model.safetensors) and its float32 reference beside it, named ``<dst name>.reference``.
    Embeddings, norms and lm_head stay unquantized in the format's dtype (float16 for AWQ and
    GPTQ, bfloat16 otherwise), and hold the same values in the reference.

    ``fmt`` and its ``options`` (the fields of its class in quant_formats):
        "awq"                      group_size=128
        "gptq"                     group_size=128, sym=True, desc_act=False, seed=0
        "compressed-tensors-int4"  group_size=128, sym=True
        "compressed-tensors-fp8"   per_channel=False, dynamic=False
        "fp8"                      weight_block_size=(128, 128), scale_dtype=torch.float32
        "modelopt-fp8"             (none)
    """
    quant_format = FORMATS[fmt](**options)
    input_absmax = calibrate(src)
    quantized: dict[str, torch.Tensor] = {}
    meant: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(src / WEIGHTS).items():
        linear = LINEAR.fullmatch(name)
        if linear is None:
            kept = tensor.to(quant_format.dtype)
            quantized[name], meant[name] = kept, kept.float()
            continue
        module, layer, projection = linear.groups()
        tensors, meant[name] = quant_format.quantize(
            int(layer), projection, tensor.float(), input_absmax[module]
        )
        quantized.update({f"{module}.{key}": value for key, value in tensors.items()})
    config = json.loads((src / "config.json").read_text())
    reference = dst.with_name(f"{dst.name}.reference")
    for directory in (dst, reference):
        directory.mkdir(parents=True)
        copy_tokenizer(src, directory)
    save_file(quantized, dst / WEIGHTS, {"format": "pt"})
    quant_format.write_config(dst, {**config, "dtype": str(quant_format.dtype).split(".")[-1]})
    save_file(meant, reference / WEIGHTS, {"format": "pt"})
    write_config_json(reference, {**config, "dtype": "float32"})
    return QuantizedCheckpoint(dst, reference)


def calibrate(src: Path) -> dict[str, float]:
    """Each linear's largest |input| over a fixed random prompt (static activation scales)."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    absmax: dict[str, float] = {}

    def record(name: str):
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            absmax[name] = max(absmax.get(name, 0.0), args[0].abs().max().item())

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(record(name))
    tokens = torch.randint(
        model.config.vocab_size, (1, CALIBRATION_TOKENS), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        model(tokens)
    return absmax


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Every file of ``src`` but its weights and config.json (tokenizer, chat template,
    generation config)."""
    for file in src.iterdir():
        if file.name not in (WEIGHTS, "config.json"):
            shutil.copy(file, dst / file.name)
