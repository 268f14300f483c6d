"""The shared decoder with a mixture-of-experts block in place of the MLP of its sparse
layers (``MoEConfig.is_sparse``); each family's file says where its checkpoint keeps the
block and how it names an expert's projections."""

from collections.abc import Mapping
from typing import Any

from torch import nn

from kvserve.engine.layers.moe.router import Routing, SoftmaxTopK
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.moe_block import SparseMoeBlock, expert_tensors
from kvserve.engine.models.moe_config import MoEConfig


class MoEDecoderLM(DecoderLM):
    block = "mlp"
    """The checkpoint's name of a layer's MoE block (ours is always ``mlp``)."""
    expert_names = ("gate_proj", "up_proj", "down_proj")
    """The checkpoint's names of an expert's gate, up and down projections."""

    @property
    def moe(self) -> MoEConfig:
        if self.config.moe is None:
            raise ValueError(
                f"config.json of a {self.config.architecture} names no experts "
                "(num_experts or num_local_experts)"
            )
        return self.config.moe

    def routing(self) -> Routing:
        """Softmax over the experts, then the top k (renormalised if ``norm_topk_prob``)."""
        return SoftmaxTopK(self.moe.top_k, self.moe.norm_topk_prob)

    def build_mlp(self, layer: int, prefix: str) -> nn.Module:
        if not self.moe.is_sparse(layer):
            return super().build_mlp(layer, prefix)
        block = f"{prefix}.{self.block}"
        return SparseMoeBlock(
            self.config, self.moe, self.tp, block, self.routing(), self.expert_names
        )

    def checkpoint_tensors(self) -> Mapping[str, tuple[str, Any]]:
        tensors: dict[str, tuple[str, Any]] = dict(
            expert_tensors(self.moe.num_experts, self.block, self.expert_names)
        )
        if self.block != "mlp":
            tensors[f"{self.block}.gate.weight"] = ("mlp.gate.weight", None)
        if self.moe.shared_expert_intermediate_size is not None:
            for shard_id, name in enumerate(("gate_proj", "up_proj")):
                target = "mlp.shared_expert.gate_up_proj.weight"
                tensors[f"{self.block}.shared_expert.{name}.weight"] = (target, shard_id)
        return tensors
