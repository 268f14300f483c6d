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

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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


def default_weight_loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
    """The whole tensor: replicated parameters (norms, replicated linears)."""
    with torch.no_grad():
        param.copy_(read(loaded))


class LinearMethod:
    """How a linear layer's weights are created, finished after loading and applied."""

    def create_weights(self, layer: "LinearBase", bias: bool) -> None:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: "LinearBase", packed: bool) -> None:
        """Called once every weight is loaded. ``packed``: the execution plan's choice to
        relay weights out for the CPU kernels (``cpu_linear.packed_linear.can_pack``)."""

    def apply(self, layer: "LinearBase", x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the activations' dtype. With ``packed``, the weight is relaid out once for
    the kernel that runs it on this CPU (``cpu_linear.packed_linear.packed``: AMX, AVX-512
    BF16 dot products, float32 panels, or oneDNN) and the plain weight is dropped."""

    def create_weights(self, layer: "LinearBase", bias: bool) -> None:
        layer.weight = nn.Parameter(
            torch.empty(layer.out_features, layer.in_features), requires_grad=False
        )
        set_weight_loader(layer.weight, layer.weight_loader)
        if bias:
            layer.bias = nn.Parameter(torch.empty(layer.out_features), requires_grad=False)
            set_weight_loader(layer.bias, layer.weight_loader)
        else:
            layer.register_parameter("bias", None)

    def process_weights_after_loading(self, layer: "LinearBase", packed: bool) -> None:
        if packed:
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
        self.kernel = None
        self.method.create_weights(self, bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, tp, method)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        default_weight_loader(param, loaded)


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
        rows = param.shape[0]
        with torch.no_grad():
            param.copy_(read(loaded, 0, self.tp.rank * rows, rows))


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
        with torch.no_grad():
            param[start : start + rows].copy_(read(loaded, 0, self.tp.rank * rows, rows))


class QKVParallelLinear(LinearBase):
    """q, k and v in one matmul, ``[q | k | v]`` of this rank's heads: ``num_heads / size``
    query heads and ``tp.kv_heads(num_kv_heads)`` kv heads (a share, or the one head this
    rank's query heads use when there are fewer kv heads than ranks)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
    ) -> None:
        self.num_heads = divide(num_heads, tp.size, "query heads")
        self.num_kv_heads = tp.kv_heads(num_kv_heads)
        self.head_dim = head_dim
        # this rank's first kv head: its share's first, or the one its query heads use
        if num_kv_heads >= tp.size:
            self.kv_head_start = tp.rank * self.num_kv_heads
        else:
            self.kv_head_start = tp.rank * num_kv_heads // tp.size
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias, tp, method)
        for param in self.parameters():
            set_shard_ids(param, {"q", "k", "v"})

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id == "q":
            start, rows, source = 0, self.q_size, self.tp.rank * self.q_size
        else:
            start = self.q_size + (0 if shard_id == "k" else self.kv_size)
            rows, source = self.kv_size, self.kv_head_start * self.head_dim
        with torch.no_grad():
            param[start : start + rows].copy_(read(loaded, 0, source, rows))


class RowParallelLinear(LinearBase):
    """Input features split over the ranks (the column-parallel layer before it left its
    output so); the partial products are summed over the ranks by one all-reduce."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        what: str = "input features",
    ) -> None:
        super().__init__(divide(in_features, tp.size, what), out_features, bias, tp, method)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        with torch.no_grad():
            if param.dim() == 1:  # the bias: added once, by rank 0
                param.copy_(read(loaded)) if self.tp.rank == 0 else param.zero_()
                return
            cols = param.shape[1]
            param.copy_(read(loaded, 1, self.tp.rank * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.method.apply(self, x)
        if self.tp.size > 1:
            self.tp.all_reduce(out)
        return out
