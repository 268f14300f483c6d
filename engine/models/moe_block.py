"""The mixture-of-experts block that takes a dense MLP's place in a decoder layer: a
router, the experts (``layers/moe``) and, in Qwen2-MoE, a shared expert with its gate.
It lives with the models, not the layers, because its shared expert is the decoder's MLP."""

from collections.abc import Iterator

import torch
from torch import nn

from kvserve.engine.layers.linear import ReplicatedLinear
from kvserve.engine.layers.moe.fused_moe import PARTS, FusedMoE
from kvserve.engine.layers.moe.router import Routing
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.decoder import MLP
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.moe_config import MoEConfig
from kvserve.engine.quantization.linear_methods import linear_method

EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")
"""Qwen's checkpoint names of an expert's gate, up and down projections."""


class SparseMoeBlock(nn.Module):
    """``x [T, H]`` → ``sum_k w_k expert_k(x)`` over each token's routed experts (plus
    ``sigmoid(shared_expert_gate(x)) * shared_expert(x)`` with a shared expert). Every rank
    routes every token (the router is replicated) and runs its share of each expert's and
    of the shared expert's intermediate features; the partial sums meet in one all-reduce.
    Parameter names: ``gate`` (the router), ``experts``, ``shared_expert``,
    ``shared_expert_gate``, as Qwen2-MoE's checkpoints name them."""

    def __init__(
        self,
        cfg: ModelConfig,
        moe: MoEConfig,
        tp: TensorParallel,
        prefix: str,
        routing: Routing,
        expert_names: tuple[str, str, str] = EXPERT_NAMES,
    ) -> None:
        """``prefix``: the checkpoint's name of this block (``model.layers.3.mlp``);
        ``expert_names``: the checkpoint's names of an expert's gate, up and down
        projections. Quantized experts are refused."""
        super().__init__()
        quant = cfg.quantization
        experts = [f"{prefix}.experts.0.{name}" for name in expert_names]
        if quant is not None and quant.quantizes(experts):
            raise ValueError(
                f"{prefix}.experts are quantized ({quant.describe()}); mixture-of-experts "
                "layers run 16-bit experts only"
            )
        self.tp = tp
        self.routing = routing
        gate = linear_method(quant, [f"{prefix}.gate"])
        self.gate = ReplicatedLinear(cfg.hidden_size, moe.num_experts, False, tp, gate)
        self.experts = FusedMoE(
            moe.num_experts, cfg.hidden_size, moe.intermediate_size, tp, what=moe.intermediate_name
        )
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: ReplicatedLinear | None = None
        if moe.shared_expert_intermediate_size is not None:
            size = (moe.shared_expert_intermediate_size, "shared_expert_intermediate_size")
            shared = f"{prefix}.shared_expert"
            self.shared_expert = MLP(cfg, tp, shared, size, reduce_results=False)
            gate = linear_method(quant, [f"{shared}_gate"])
            self.shared_expert_gate = ReplicatedLinear(cfg.hidden_size, 1, False, tp, gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.routing(self.gate(x))
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            shared = self.shared_expert(x)
            out += torch.sigmoid(self.shared_expert_gate(x)) * shared
        return self.tp.all_reduce(out)


def expert_tensors(
    num_experts: int, block: str, names: tuple[str, str, str] = EXPERT_NAMES
) -> Iterator[tuple[str, tuple[str, tuple[int, str]]]]:
    """``DecoderLM.checkpoint_tensors`` entries of a block's per-expert checkpoint tensors
    (``{block}.experts.{e}.{gate, up, down name}.weight``) → ``mlp.experts.w13`` / ``w2``."""
    for e in range(num_experts):
        for name, part in zip(names, PARTS, strict=True):
            param = "w2" if part == "w2" else "w13"
            yield f"{block}.experts.{e}.{name}.weight", (f"mlp.experts.{param}", (e, part))
