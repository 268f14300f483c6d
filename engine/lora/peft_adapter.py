"""A PEFT LoRA adapter directory, read and checked against the served model.

The directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` with tensors
named ``base_model.model.model.layers.N.<self_attn|mlp>.<module>.lora_<A|B>.weight``. The
adapter adds ``B @ A * scaling`` to a module's weight, ``scaling`` being ``lora_alpha / r``
(``lora_alpha / sqrt(r)`` with ``use_rslora``); the scaling is folded into B here. What
kvserve cannot apply exactly is refused with the adapter and the field named: DoRA, a bias,
``modules_to_save``, per-module ranks or alphas, targets other than the seven projections
(embeddings, lm_head), MoE experts, ranks above ``max_lora_rank``, and the other PEFT
fields that change what is computed (``_UNSUPPORTED_WHEN_SET``).
"""

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.models.model_config import ModelConfig

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
_TENSOR = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)
# PEFT fields that change what the adapter computes in ways kvserve does not apply
_UNSUPPORTED_WHEN_SET = (
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "layer_replication",
    "lora_bias",
    "use_qalora",
    "target_parameters",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "fan_in_fan_out",
)
_SERIALS = itertools.count(1)


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served: missing, corrupt, or not fitting the model."""


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter in host memory: per (layer, module), A ``[rank, in]`` and B ``[out, rank]``
    already multiplied by the scaling, float32. ``lora_int_id``: its ``LoRARequest``'s number
    (KV events carry it as ``lora_id``). ``serial`` tells apart two loads of one name
    (device slots are keyed by it); ``cache_key`` is the parent key of a request's first
    block under this adapter (SHA-256 of its name and path), so requests of two adapters
    never share prefix-cache blocks and every pod keys them alike."""

    name: str
    path: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    lora_int_id: int
    serial: int = field(default_factory=lambda: next(_SERIALS))

    @property
    def cache_key(self) -> bytes:
        return hashlib.sha256(f"lora\0{self.name}\0{self.path}".encode()).digest()


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection, unsharded."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def load_peft_adapter(request: LoRARequest, cfg: ModelConfig, max_rank: int) -> LoRAAdapter:
    """Read and check the adapter at ``request.lora_path``; a ``LoRAAdapterError`` naming
    it and the field, file or tensor at fault."""
    name, path = request.lora_name, request.lora_path
    where = Path(path)
    config_file, weights_file = where / "adapter_config.json", where / "adapter_model.safetensors"
    if not where.is_dir():
        raise LoRAAdapterError(f"LoRA adapter {name!r}: no such directory {path!r}")
    if not config_file.is_file() or not weights_file.is_file():
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: {path!r} lacks adapter_config.json or "
            "adapter_model.safetensors"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: adapter_config.json is unreadable: {e}"
        ) from e
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"LoRA adapter {name!r}: adapter_config.json is not an object")
    rank, scaling, targets = _check_config(name, config, cfg, max_rank)
    try:
        tensors = load_file(str(weights_file))
    except Exception as e:  # safetensors raises its own errors on a corrupt file
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: adapter_model.safetensors is unreadable: {e}"
        ) from e
    weights = _pair(name, tensors, cfg, rank, scaling, targets)
    return LoRAAdapter(name, path, rank, weights, request.lora_int_id)


def _check_config(
    name: str, config: dict, cfg: ModelConfig, max_rank: int
) -> tuple[int, float, set[str]]:
    def refuse(field: str, why: str) -> LoRAAdapterError:
        return LoRAAdapterError(f"LoRA adapter {name!r}: adapter_config.json {field}: {why}")

    if config.get("peft_type", "LORA") != "LORA":
        raise refuse("peft_type", f"{config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise refuse("r", f"must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise refuse("r", f"rank {rank} is above --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float):
        raise refuse("lora_alpha", f"must be a number, got {alpha!r}")
    if config.get("use_dora"):
        raise refuse("use_dora", "DoRA adapters are not supported")
    if config.get("bias", "none") != "none":
        raise refuse("bias", f"{config['bias']!r}: only 'none' is supported")
    for key in _UNSUPPORTED_WHEN_SET:
        if config.get(key):
            raise refuse(key, f"{config[key]!r} is not supported (must be empty)")
    raw = config.get("target_modules")
    targets = {raw} if isinstance(raw, str) else set(raw or ())
    unknown = sorted(targets - set(TARGETS))
    if unknown or not targets:
        raise refuse("target_modules", f"{unknown or raw!r}: only {', '.join(TARGETS)}")
    if cfg.moe is not None and targets & set(MLP_TARGETS):
        raise refuse("target_modules", "LoRA on a mixture-of-experts model's MLP is not supported")
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return rank, scale, targets


def _pair(
    name: str,
    tensors: dict[str, torch.Tensor],
    cfg: ModelConfig,
    rank: int,
    scaling: float,
    targets: set[str],
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """A and B of each (layer, module), shapes checked against the model."""
    shapes = module_shapes(cfg)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _TENSOR.match(key)
        if match is None or match[2] not in targets or int(match[1]) >= cfg.num_layers:
            raise LoRAAdapterError(
                f"LoRA adapter {name!r}: tensor {key!r} does not fit the served model "
                f"({cfg.num_layers} layers; targets {', '.join(sorted(targets))})"
            )
        layer, module, half = int(match[1]), match[2], match[3]
        fan_in, fan_out = shapes[module]
        want = (rank, fan_in) if half == "A" else (fan_out, rank)
        if tuple(tensor.shape) != want:
            raise LoRAAdapterError(
                f"LoRA adapter {name!r}: tensor {key!r} has shape {list(tensor.shape)}, the "
                f"served model's {module} needs {list(want)} (is it this base model's adapter?)"
            )
        halves.setdefault((layer, module), {})[half] = tensor.float()
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise LoRAAdapterError(
                f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(pair)} "
                "but not its other half"
            )
        weights[layer, module] = (pair["A"], pair["B"] * scaling)
    if not weights:
        raise LoRAAdapterError(f"LoRA adapter {name!r}: adapter_model.safetensors has no tensor")
    return weights
