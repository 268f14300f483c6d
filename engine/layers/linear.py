"""Linear layers that know how they are sharded over a ``TensorParallel`` group and how
their weights load.

A layer is a *parallel style* (the classes below: replicated, column, merged column for
gate/up, q/k/v, row) over a *weight method* (``LinearMethod``: how the weight is created,
loaded and applied; ``UnquantizedLinearMethod`` today). A model file only picks the class of
each projection. Every parameter carries a ``weight_loader(param, loaded, shard_id)`` that
narrows the checkpoint tensor, or a safetensors slice (``safe_open(...).get_slice``), to this
rank's part, so a rank reads only its shard (Megatron's layout):

* column-parallel: rank r holds rows ``[r * n / size, (r + 1) * n / size)`` of the weight
  (and of the bias); its output is its share of the features, nothing to reduce;
* row-parallel: rank r holds those columns; the partial products are summed by one
  ``tp.all_reduce``; the bias is added once (rank 0 holds it, the others zeros);
* q/k/v: query heads split evenly; kv heads split too, or, with fewer kv heads than ranks,
  each rank holds the one kv head its query heads use (``TensorParallel.kv_heads``).

With one rank every shard is the whole tensor and the forward is the unsharded one.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers.cpu_linear import packed_linear
from kvserve.engine.layers.tensor_parallel import TensorParallel

WeightLoader = Callable[..., None]
"""``(param, loaded, shard_id=None)``: copy this rank's part of ``loaded`` (a tensor or a
safetensors slice, checkpoint shape) into ``param``."""


def divide(n: int, size: int, what: str) -> int:
    """``n / size``, or a ValueError naming ``what`` when ``size`` does not divide it."""
    if n % size:
        raise ValueError(f"{what} ({n}) cannot be split evenly over {size} tensor-parallel ranks")
    return n // size


def shape_of(loaded: Any) -> tuple[int, ...]:
    """The checkpoint shape of a tensor or a safetensors slice."""
    return tuple(loaded.get_shape()) if hasattr(loaded, "get_shape") else tuple(loaded.shape)


def read(loaded: Any, dim: int = 0, start: int = 0, length: int | None = None) -> torch.Tensor:
    """``loaded`` narrowed to ``length`` entries from ``start`` along ``dim`` (all of it by
    default), read as a tensor: from a safetensors slice only those bytes are read."""
    shape = shape_of(loaded)
    if not shape:  # a scalar: one scale for a whole tensor
        return loaded[...]
    length = shape[dim] - start if length is None else length
    index = tuple(
        slice(start, start + length) if d == dim else slice(None) for d in range(len(shape))
    )
    return loaded[index]


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def set_shard_ids(param: nn.Parameter, shard_ids: set[Any]) -> None:
    """The checkpoint tensors that fill ``param`` together (fused projections); the loader
    checks each arrived."""
    param.shard_ids = shard_ids  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Dims:
    """Where a linear layer's parameter runs along its features, which says how it shards:
    ``output``/``input``: the dimension along the output/input features (None: the
    parameter does not vary along them and every rank holds all of it); ``*_unit``: features
    per entry along that dimension (a group's or a block's size for the scales of quantized
    weights, else 1). ``added``: the parameter is added to the output (a bias), so a
    row-parallel layer holds it on rank 0 alone. ``merge``: how the parts of a fused
    projection combine a parameter with no output dimension: ``equal`` (they must agree)
    or ``max`` (activation scales: the largest serves every part)."""

    output: int | None = 0
    input: int | None = 1
    output_unit: int = 1
    input_unit: int = 1
    added: bool = False
    merge: str = "equal"


WEIGHT = Dims()
BIAS = Dims(input=None, added=True)


def set_dims(param: nn.Parameter, dims: Dims) -> None:
    param.dims = dims  # type: ignore[attr-defined]


def dims_of(param: nn.Parameter) -> Dims:
    dims: Dims = getattr(param, "dims", WEIGHT)
    return dims


def fill(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst`` = ``src``; a one-element ``src`` (a per-tensor scale) fills all of ``dst``."""
    if src.numel() == 1 and dst.numel() != 1:
        dst.fill_(src.reshape(()).to(dst.dtype))
    else:
        dst.copy_(src.reshape(dst.shape) if src.numel() == dst.numel() == 1 else src)


def default_weight_loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
    """The whole tensor: replicated parameters (norms, replicated linears)."""
    with torch.no_grad():
        fill(param, read(loaded))


def _entries(start: int, length: int, unit: int, what: str) -> tuple[int, int]:
    """Features ``[start, start + length)`` as entries of ``unit`` features each; a
    ValueError when ``start`` does not fall on an entry's edge."""
    if start % unit:
        raise ValueError(
            f"{what}: feature {start} is not on an edge of its {unit}-feature scale groups; "
            "this tensor-parallel split needs shards in whole groups"
        )
    return start // unit, cdiv(length, unit)


KERNELS = ("torch", "cpu-packed", "triton")
"""What runs a model's linears, chosen by the execution plan: ``torch`` (``F.linear``),
``cpu-packed`` (weights relaid out for this CPU's kernels: ``packed_linear``), ``triton``
(the GPU path, and its interpreter on a CPU: quantized weights stay quantized)."""


Transform = Callable[[torch.Tensor], torch.Tensor]
"""A checkpoint tensor, whole, → the layout of the parameter it fills."""


class LinearMethod:
    """How a linear layer's weights are created, finished after loading and applied.
    ``checkpoint_names`` maps a checkpoint tensor's last name part to the parameter it fills
    and the function that turns it into that parameter's layout first (None: as stored)."""

    checkpoint_names: Mapping[str, tuple[str, Transform | None]] = MappingProxyType({})

    def create_weights(self, layer: "LinearBase", bias: bool) -> None:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: "LinearBase", kernels: str) -> None:
        """Called once every weight is loaded; ``kernels`` is one of ``KERNELS``."""

    def apply(self, layer: "LinearBase", x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def add_parameter(layer: "LinearBase", name: str, data: torch.Tensor, dims: Dims = WEIGHT) -> None:
    """``data`` as ``layer``'s parameter ``name``, loaded by the layer's parallel style."""
    param = nn.Parameter(data, requires_grad=False)
    set_weight_loader(param, layer.weight_loader)
    set_dims(param, dims)
    layer.register_parameter(name, param)


def take(layer: nn.Module, name: str) -> torch.Tensor:
    """Parameter ``name`` of ``layer``, removed from it (a loaded tensor that a weight method
    turns into its runtime form)."""
    data = layer.get_parameter(name).detach()
    delattr(layer, name)
    return data


def create_bias(layer: "LinearBase", bias: bool) -> None:
    """A bias over this rank's output features, or none."""
    if bias:
        add_parameter(layer, "bias", torch.empty(layer.out_features), BIAS)
    else:
        layer.register_parameter("bias", None)


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the activations' dtype. With ``cpu-packed`` kernels, the weight is relaid
    out once for the kernel that runs it on this CPU (``cpu_linear.packed_linear.packed``:
    AMX, AVX-512 BF16 dot products, float32 panels, or oneDNN) and the plain weight is
    dropped."""

    def create_weights(self, layer: "LinearBase", bias: bool) -> None:
        add_parameter(layer, "weight", torch.empty(layer.out_features, layer.in_features))
        create_bias(layer, bias)

    def process_weights_after_loading(self, layer: "LinearBase", kernels: str) -> None:
        if kernels == "cpu-packed":
            layer.kernel = packed_linear.packed(layer)
            del layer.weight
            layer.bias = None

    def apply(self, layer: "LinearBase", x: torch.Tensor) -> torch.Tensor:
        kernel = layer.kernel
        if kernel is None:
            return F.linear(x, layer.weight, layer.bias)
        return kernel.forward(x)


class LinearBase(nn.Module):
    """``y = x W^T (+ b)`` over this rank's ``out_features x in_features`` part of W."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    kernel: nn.Module | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.in_features, self.out_features = in_features, out_features
        self.method = method or UnquantizedLinearMethod()
        self.compute_dtype = torch.get_default_dtype()
        self.kernel = None
        self.method.create_weights(self, bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def load_rows(
        self, param: nn.Parameter, loaded: Any, start: int, rows: int, source: int
    ) -> None:
        """Output features ``[source, source + rows)`` of checkpoint tensor ``loaded`` into
        features ``[start, start + rows)`` of ``param`` (whole along the input features);
        a parameter with no output dimension is merged whole (``Dims.merge``)."""
        dims = dims_of(param)
        with torch.no_grad():
            if dims.output is None:
                self._merge(param, read(loaded), dims.merge)
                return
            what = f"{type(self).__name__} rows"
            start, length = _entries(start, rows, dims.output_unit, what)
            source, _ = _entries(source, rows, dims.output_unit, what)
            dst = param.narrow(dims.output, start, length)
            if math.prod(shape_of(loaded)) == 1 and dst.numel() != 1:
                fill(dst, read(loaded))  # one scale for the whole tensor: this part's rows
            else:
                fill(dst, read(loaded, dims.output, source, length))

    def load_columns(self, param: nn.Parameter, loaded: Any, columns: int, source: int) -> None:
        """Input features ``[source, source + columns)`` of ``loaded`` into ``param``; a
        parameter with no input dimension whole, or, if added to the output (a bias), on
        rank 0 alone."""
        dims = dims_of(param)
        with torch.no_grad():
            if dims.input is None:
                if dims.added and self.tp.rank != 0:
                    param.zero_()
                else:
                    fill(param, read(loaded))
                return
            what = f"{type(self).__name__} columns"
            source, length = _entries(source, columns, dims.input_unit, what)
            fill(param, read(loaded, dims.input, source, length))

    @staticmethod
    def _merge(param: nn.Parameter, value: torch.Tensor, merge: str) -> None:
        seen: bool = getattr(param, "merged", False)
        if seen and merge == "max":
            value = torch.maximum(param.detach(), value.reshape(param.shape).to(param.dtype))
        elif seen and not torch.equal(param.detach(), value.reshape(param.shape).to(param.dtype)):
            raise ValueError(
                f"the parts of one fused {type(param).__name__} disagree on a shared tensor "
                f"of shape {tuple(param.shape)} (e.g. g_idx of q_proj and k_proj)"
            )
        fill(param, value)
        param.merged = True  # type: ignore[attr-defined]


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        self.load_rows(param, loaded, 0, self.out_features, 0)


class ColumnParallelLinear(LinearBase):
    """Output features split over the ranks: rank r computes its ``out / size`` of them."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        what: str = "output features",
    ) -> None:
        super().__init__(in_features, divide(out_features, tp.size, what), bias, tp, method)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        rows = self.out_features
        self.load_rows(param, loaded, 0, rows, self.tp.rank * rows)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel projections of one input in one matmul (gate and up): this
    rank's part of each, side by side; checkpoint tensor ``shard_id`` i fills part i."""

    def __init__(
        self,
        in_features: int,
        out_features: list[int],
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        what: str = "output features",
    ) -> None:
        self.parts = [divide(n, tp.size, what) for n in out_features]
        super().__init__(in_features, sum(self.parts), bias, tp, method)
        for param in self.parameters():
            set_shard_ids(param, set(range(len(self.parts))))

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        rows = self.parts[shard_id]
        start = sum(self.parts[:shard_id])
        self.load_rows(param, loaded, start, rows, self.tp.rank * rows)


class QKVParallelLinear(LinearBase):
    """q, k and v in one matmul, ``[q | k | v]`` of this rank's heads: ``num_heads / size``
    query heads and ``tp.kv_heads(num_kv_heads)`` kv heads (a share, or the one head this
    rank's query heads use when there are fewer kv heads than ranks). With ``output_gate``
    (Qwen3-Next, Qwen3.5) each query head is ``[q | gate]``, ``2 * head_dim`` rows of q_proj,
    and ``q_size`` counts both. ``parts``: the projections it has, ``qkv``, or ``qk`` (the
    values are the keys: Gemma 4's ``attention_k_eq_v``) or ``q`` (the layer reads another
    layer's keys and values: Gemma 4's KV-shared layers)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        output_gate: bool = False,
        parts: str = "qkv",
    ) -> None:
        self.num_heads = divide(num_heads, tp.size, "query heads")
        self.num_kv_heads = tp.kv_heads(num_kv_heads)
        self.head_dim = head_dim
        # this rank's first kv head: its share's first, or the one its query heads use
        if num_kv_heads >= tp.size:
            self.kv_head_start = tp.rank * self.num_kv_heads
        else:
            self.kv_head_start = tp.rank * num_kv_heads // tp.size
        q_rows = 2 * head_dim if output_gate else head_dim
        self.q_size, self.kv_size = self.num_heads * q_rows, self.num_kv_heads * head_dim
        if parts not in ("qkv", "qk", "q"):
            raise ValueError(f"a q/k/v projection's parts are qkv, qk or q, not {parts!r}")
        self.parts = parts
        out_features = self.q_size + (len(parts) - 1) * self.kv_size
        super().__init__(hidden_size, out_features, bias, tp, method)
        for param in self.parameters():
            set_shard_ids(param, set(parts))

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id == "q":
            start, rows, source = 0, self.q_size, self.tp.rank * self.q_size
        else:
            start = self.q_size + (0 if shard_id == "k" else self.kv_size)
            rows, source = self.kv_size, self.kv_head_start * self.head_dim
        self.load_rows(param, loaded, start, rows, source)


class RowParallelLinear(LinearBase):
    """Input features split over the ranks (the column-parallel layer before it left its
    output so); the partial products are summed over the ranks by one all-reduce, or, if
    not ``reduce_results``, left to the caller to sum (with other partial sums: an MoE
    block's shared expert and its experts)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        what: str = "input features",
        reduce_results: bool = True,
    ) -> None:
        super().__init__(divide(in_features, tp.size, what), out_features, bias, tp, method)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        columns = self.in_features
        self.load_columns(param, loaded, columns, self.tp.rank * columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.method.apply(self, x)
        if self.tp.size > 1 and self.reduce_results:
            self.tp.all_reduce(out)
        return out
