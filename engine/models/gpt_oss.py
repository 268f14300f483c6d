"""gpt-oss: attention with learned sinks and q/k/v/o biases, sliding-window (``sliding_window``
tokens) and full layers as ``layer_types`` alternate them, YaRN RoPE; a mixture-of-experts
block in every layer: a router with a bias (top-k of the logits, then a softmax over those),
experts with biases and the clamped SwiGLU, stacked in the checkpoint (``mlp.experts.
gate_up_proj [E, H, 2I]``, gate and up interleaved) or in MXFP4 (``quant_method: mxfp4``:
packed for the Triton kernel, dequantized at load elsewhere; ``layers/moe/stacked_experts``)."""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from kvserve.engine.layers.linear import ReplicatedLinear
from kvserve.engine.layers.moe.fused_moe import FusedMoE
from kvserve.engine.layers.moe.router import TopKSoftmax
from kvserve.engine.layers.moe.stacked_experts import stacked_layout
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.decoder import DecoderLM, Switches
from kvserve.engine.models.model_config import ModelConfig

_EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


class GptOssMoeBlock(nn.Module):
    """``x [T, H]`` → ``sum_k w_k expert_k(x)``: every rank routes every token (the router
    is replicated), runs its share of each expert's features, and the partial sums meet in
    one all-reduce. Parameter names: ``router``, ``experts``, as the checkpoints name them."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        moe = cfg.moe
        if moe is None:
            raise ValueError("config.json of a GptOssForCausalLM names no num_local_experts")
        self.tp = tp
        self.routing = TopKSoftmax(moe.top_k)
        self.router = ReplicatedLinear(cfg.hidden_size, moe.num_experts, True, tp)
        self.experts = FusedMoE(
            moe.num_experts, cfg.hidden_size, moe.intermediate_size, tp,
            what=moe.intermediate_name, activation="swigluoai", bias=True,
            layout=stacked_layout(cfg.quantization),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.routing(self.router(x))
        return self.tp.all_reduce(self.experts(x, weights, ids))


class GptOssForCausalLM(DecoderLM):
    @classmethod
    def switches(cls, cfg: ModelConfig) -> Switches:
        return Switches(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)

    def attention_kind(self, layer: int) -> Mapping[str, Any]:
        return {**super().attention_kind(layer), "sinks": True}

    def build_mlp(self, layer: int, prefix: str) -> nn.Module:
        return GptOssMoeBlock(self.config, self.tp)

    def checkpoint_tensors(self) -> Mapping[str, tuple[str, Any]]:
        """The stacked experts' tensors (or their MXFP4 blocks and scales) → ``w13``,
        ``w2`` and their biases."""
        ours = {"gate_up_proj": "w13", "down_proj": "w2"}
        tensors: dict[str, tuple[str, Any]] = {}
        for name in _EXPERT_TENSORS:
            param = ours[name.removesuffix("_bias")] + ("_bias" if name.endswith("_bias") else "")
            tensors[f"mlp.experts.{name}"] = (f"mlp.experts.{param}", None)
        for name, param in ours.items():
            for part in ("blocks", "scales"):
                tensors[f"mlp.experts.{name}_{part}"] = (f"mlp.experts.{param}_{part}", None)
        return tensors
