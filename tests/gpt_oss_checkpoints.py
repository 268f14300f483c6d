"""Tiny gpt-oss checkpoints: a dense one built by transformers with gpt-oss's layer pattern
(sliding-window and full layers alternating; a window of 8 tokens, which the test prompts
cross), YaRN RoPE over an original context of 64 positions, 8 experts with 2 per token; and
its MXFP4 twin in the real on-disk format (``quant_method: mxfp4``, the experts as
``*_blocks`` and ``*_scales``), with a float32 reference holding the dequantized experts."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from checkpoints import build_checkpoint
from quant_checkpoints import QuantizedCheckpoint

WINDOW = 8
GPT_OSS = dict(
    num_hidden_layers=2,
    num_local_experts=8,
    num_experts_per_tok=2,
    intermediate_size=32,
    head_dim=16,
    sliding_window=WINDOW,
    max_position_embeddings=2048,
    rope_parameters=dict(
        rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
        truncate=False, original_max_position_embeddings=64,
    ),
)  # fmt: skip
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def build_gpt_oss(path: Path, seed: int = 0, **overrides) -> Path:
    return build_checkpoint("gpt_oss", path, seed, **{**GPT_OSS, **overrides})


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [..., N, K]`` → MXFP4 ``blocks [..., N, K/32, 16]`` and ``scales [..., N,
    K/32]``: each 32 features' scale the power of two that brings their largest magnitude to
    6 or under, each value the nearest e2m1 code, the low nibble first."""
    groups = weight.float().unflatten(-1, (-1, 32))
    amax = groups.abs().amax(-1, keepdim=True)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6)), torch.full_like(amax, -127))
    exponent = exponent.clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)
    codes = (scaled.abs().unsqueeze(-1) - E2M1_MAGNITUDES).abs().argmin(-1)
    codes = codes | ((scaled < 0) & (codes > 0)).long() << 3
    packed = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
    return packed, (exponent.squeeze(-1) + 127).to(torch.uint8)


def write_mxfp4(src: Path, dst: Path) -> QuantizedCheckpoint:
    """The gpt-oss checkpoint at ``src`` with MXFP4 experts at ``dst``, and its reference
    (``<dst name>.reference``): ``src`` with each expert weight replaced by what its MXFP4
    form means."""
    from kvserve.engine.kernels.mxfp4 import dequantize_mxfp4

    reference = dst.with_name(f"{dst.name}.reference")
    quantized, meant = {}, {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if not name.endswith(EXPERT_WEIGHTS):
            quantized[name] = meant[name] = tensor
            continue
        blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))  # stored [E, N, K]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
        meant[name] = dequantize_mxfp4(blocks, scales).transpose(1, 2).contiguous()
    config = json.loads((src / "config.json").read_text())
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                     "model.embed_tokens", "lm_head"]  # fmt: skip
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": not_converted}
    for directory, weights, extra in ((dst, quantized, {"quantization_config": quant}),
                                      (reference, meant, {})):  # fmt: skip
        shutil.copytree(src, directory)
        save_file(weights, directory / "model.safetensors", {"format": "pt"})
        (directory / "config.json").write_text(json.dumps({**config, **extra}, indent=2))
    return QuantizedCheckpoint(dst, reference)
