"""The experts of a mixture-of-experts block as one layer: every expert's weights stacked,
loaded from per-expert checkpoint tensors, sharded over a ``TensorParallel`` group along
the experts' intermediate features, and run for the tokens routed to each.

Expert e is a SiLU-gated MLP, ``w2[e] @ (silu(w1[e] @ x) * (w3[e] @ x))`` (w1 the gate
projection, w3 the up projection, w2 the down projection: Mixtral's names, vLLM's shard ids).
Rank r holds features ``[r * I / size, (r + 1) * I / size)`` of each expert's intermediate
size I, as a column-parallel gate/up and a row-parallel down projection would: ``w13
[E, 2 * I / size, H]`` (this rank's gate rows, then its up rows) and ``w2 [E, H, I / size]``.
A rank's output is its partial sum; the caller all-reduces it (once, with a shared expert's).

gpt-oss's experts (``activation="swigluoai"``, ``bias=True``) add ``w13_bias [E, 2 * I /
size]`` to the gate/up rows and ``w2_bias [E, H]`` to the output, and load from tensors
that stack every expert (``layout`` ``"stacked"``, or ``"mxfp4"``: ``stacked_experts``).
MXFP4 weights stay packed (``w13``, ``w2`` as ``Mxfp4Weight``) for the Triton kernel and
are dequantized to the model's dtype after loading for every other path.
"""

import importlib
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.kernels.mxfp4 import MXFP4_BLOCK, Mxfp4Weight, dequantize_mxfp4
from kvserve.engine.layers import fused_ops
from kvserve.engine.layers.activation import gelu_tanh_and_mul, swigluoai_and_mul
from kvserve.engine.layers.cpu_linear import packed_linear
from kvserve.engine.layers.linear import divide, read, set_shard_ids, set_weight_loader, shape_of
from kvserve.engine.layers.moe import stacked_experts
from kvserve.engine.layers.tensor_parallel import TensorParallel

PARTS = ("w1", "w3", "w2")
"""The checkpoint tensors of one expert, as shard ids: gate, up, down."""
ACTIVATIONS = {
    "silu": fused_ops.silu_and_mul,
    "swigluoai": swigluoai_and_mul,
    "gelu_tanh": gelu_tanh_and_mul,
}
LAYOUTS = ("experts", "stacked", "mxfp4", "gate_up")


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's projection as the packed CPU kernels read a linear layer."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


class FusedMoE(nn.Module):
    """``forward(x [T, H], weights [T, K], ids [T, K])`` → this rank's part of
    ``sum_k weights[t, k] * expert_{ids[t, k]}(x_t)`` for every token t.

    On a CPU (and with torch's kernels anywhere) the (token, expert) pairs are sorted by
    expert; each expert that has tokens multiplies its tokens' rows, gathered, in two
    matmuls, on the packed CPU kernels after ``process_weights_after_loading("cpu-packed")``
    (one per expert and projection), and the rows, scaled by their weights, are added into
    their tokens' output in expert order (transformers' order of the sums). With the Triton
    kernels one fused kernel does it all (``kernels.triton_fused_moe``)."""

    w13: nn.Parameter
    w2: nn.Parameter
    w13_bias: nn.Parameter | None
    w2_bias: nn.Parameter | None

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        tp: TensorParallel,
        *,
        what: str = "moe_intermediate_size",
        activation: str = "silu",
        bias: bool = False,
        layout: str = "experts",
    ) -> None:
        """``what``: config.json's name of ``intermediate_size``, for errors; ``activation``:
        a key of ``ACTIVATIONS``; ``bias``, ``layout``: see the module."""
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown expert layout {layout!r}; one of {LAYOUTS}")
        self.activation, self.layout = activation, layout
        self.act = ACTIVATIONS[activation]
        self.dtype = torch.get_default_dtype()  # the dense weights'
        self.tp = tp
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.full_intermediate = intermediate_size
        self.what = what
        self.intermediate = divide(intermediate_size, tp.size, what)
        self.kernels = "torch"
        self.gate_up_kernels: nn.ModuleList | None = None
        self.down_kernels: nn.ModuleList | None = None
        if layout == "mxfp4":
            self._mxfp4_parameters()
        else:
            shapes = {
                "w13": ((num_experts, 2 * self.intermediate, hidden_size), ("w1", "w3")),
                "w2": ((num_experts, hidden_size, self.intermediate), ("w2",)),
            }
            for name, (shape, parts) in shapes.items():
                param = nn.Parameter(torch.empty(shape), requires_grad=False)
                set_weight_loader(param, self.weight_loader)
                if layout == "experts":
                    set_shard_ids(param, {(e, p) for e in range(num_experts) for p in parts})
                self.register_parameter(name, param)
        biases = {
            "w13_bias": (num_experts, 2 * self.intermediate),
            "w2_bias": (num_experts, hidden_size),
        }
        for name, bias_shape in biases.items():
            bias_param = None
            if bias:
                bias_param = nn.Parameter(torch.empty(bias_shape), requires_grad=False)
                set_weight_loader(bias_param, self.weight_loader)
            self.register_parameter(name, bias_param)

    def _mxfp4_parameters(self) -> None:
        """The packed weights, uint8 (``stacked_experts``); n must be whole groups of 32."""
        for size, what in (
            (self.hidden_size, "hidden_size"),
            (self.intermediate, "experts' intermediate_size per rank"),
        ):
            if size % MXFP4_BLOCK:
                raise ValueError(
                    f"MXFP4 experts need a {what} that is a multiple of {MXFP4_BLOCK}, not {size}"
                )
        shapes = stacked_experts.mxfp4_shapes(self.num_experts, self.hidden_size, self.intermediate)
        for name, shape in shapes.items():
            param = nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)
            set_weight_loader(param, self.weight_loader)
            self.register_parameter(name, param)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any) -> None:
        """Checkpoint tensor ``shard_id = (expert, part)`` (part one of PARTS: ``[I, H]`` for
        w1 and w3, ``[H, I]`` for w2) into this rank's features of that expert; a tensor of
        every expert (``shard_id`` None: ``stacked_experts``) into every expert's."""
        if shard_id is None and self.layout == "gate_up":
            self._load_gate_up(param, loaded)
            return
        if shard_id is None:
            name = next(n for n, p in self.named_parameters(recurse=False) if p is param)
            shape = (self.num_experts, self.hidden_size, self.full_intermediate)
            with torch.no_grad():
                param.copy_(
                    stacked_experts.rank_part(name, loaded, self.tp, self.intermediate, shape)
                )
            return
        expert, part = shard_id
        full = (self.hidden_size, self.full_intermediate)
        expected = full if part == "w2" else full[::-1]
        if shape_of(loaded) != expected:
            raise ValueError(
                f"expert {expert}'s {part} must have shape {list(expected)} (hidden_size, "
                f"{self.what}), not {list(shape_of(loaded))}"
            )
        n, start = self.intermediate, self.tp.rank * self.intermediate
        with torch.no_grad():
            if part == "w2":
                param[expert].copy_(read(loaded, 1, start, n))
            else:
                rows = param[expert].narrow(0, 0 if part == "w1" else n, n)
                rows.copy_(read(loaded, 0, start, n))

    def _load_gate_up(self, param: nn.Parameter, loaded: Any) -> None:
        """Layout ``gate_up`` (transformers 5's stacked experts, Gemma 4's): ``gate_up_proj
        [E, 2 * I, H]`` (every gate row, then every up row) into ``w13``, ``down_proj [E, H,
        I]`` into ``w2``, this rank's features of each."""
        w13 = param is self.w13
        experts, hidden, inter = self.num_experts, self.hidden_size, self.full_intermediate
        full = (experts, 2 * inter, hidden) if w13 else (experts, hidden, inter)
        if shape_of(loaded) != full:
            name = "gate_up_proj" if w13 else "down_proj"
            raise ValueError(
                f"the experts' {name} must have shape {list(full)} (num_experts, "
                f"hidden_size, {self.what}), not {list(shape_of(loaded))}"
            )
        n, start = self.intermediate, self.tp.rank * self.intermediate
        with torch.no_grad():
            if not w13:
                param.copy_(read(loaded, 2, start, n))
                return
            param[:, :n].copy_(read(loaded, 1, start, n))
            param[:, n:].copy_(read(loaded, 1, inter + start, n))

    def process_weights_after_loading(self, kernels: str) -> None:
        """``kernels``: one of ``linear.KERNELS``. With ``cpu-packed`` each expert's two
        projections are packed for this CPU's kernel and the stacked weights dropped.
        MXFP4 weights become ``Mxfp4Weight``s for ``triton``, else dense ``w13``/``w2``.
        The fused Triton kernel has no GeGLU: ``gelu_tanh`` experts run grouped in torch."""
        no_fused_kernel = kernels == "triton" and self.activation == "gelu_tanh"
        self.kernels = "torch" if no_fused_kernel else kernels
        if self.layout == "mxfp4":
            packed = {name: getattr(self, name) for name in stacked_experts.MXFP4_PARAMS}
            for name in stacked_experts.MXFP4_PARAMS:
                delattr(self, name)
            for w in ("w13", "w2"):
                weight = Mxfp4Weight(packed[f"{w}_blocks"].data, packed[f"{w}_scales"].data)
                if kernels == "triton":
                    setattr(self, w, weight)
                else:
                    dense = dequantize_mxfp4(*weight, dtype=self.dtype)
                    self.register_parameter(w, nn.Parameter(dense, requires_grad=False))
        if kernels == "cpu-packed":
            self.gate_up_kernels = nn.ModuleList(
                packed_linear.packed(ExpertWeights(w, self._bias("w13_bias", e)))
                for e, w in enumerate(self.w13.detach())
            )
            self.down_kernels = nn.ModuleList(
                packed_linear.packed(ExpertWeights(w, self._bias("w2_bias", e)))
                for e, w in enumerate(self.w2.detach())
            )
            del self.w13, self.w2

    def _bias(self, name: str, expert: int) -> torch.Tensor | None:
        bias = getattr(self, name)
        return None if bias is None else bias.detach()[expert]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.kernels == "triton":
            kernels = importlib.import_module("kvserve.engine.kernels.triton_fused_moe")
            out: torch.Tensor = kernels.fused_moe(
                x, self.w13, self.w2, weights, ids, activation=self.activation,
                w13_bias=self.w13_bias, w2_bias=self.w2_bias,
            )  # fmt: skip
            return out
        return self.grouped(x, weights, ids)

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The forward with the (token, expert) pairs grouped by expert: the reference the
        fused kernel is tested against."""
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        tokens = order // ids.shape[1]
        scales = weights.flatten()[order].to(x.dtype).unsqueeze(1)
        counts = torch.bincount(flat, minlength=self.num_experts)
        ends = list(accumulate(counts.tolist()))
        out = torch.zeros_like(x)
        for e in counts.nonzero().flatten().tolist():  # the experts that have tokens
            start = ends[e - 1] if e else 0
            rows = tokens[start : ends[e]]
            h = self.expert(e, x.index_select(0, rows))
            out.index_add_(0, rows, h.mul_(scales[start : ends[e]]))
        return out

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e``'s (this rank's part of its) MLP of rows ``x``."""
        if self.gate_up_kernels is not None and self.down_kernels is not None:
            return self.down_kernels[e](self.act(self.gate_up_kernels[e](x)))
        gate_up = F.linear(x, self.w13[e], self._bias("w13_bias", e))
        return F.linear(self.act(gate_up), self.w2[e], self._bias("w2_bias", e))
