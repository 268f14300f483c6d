"""4-bit weight-only linear layers (W4A16): AWQ, GPTQ and compressed-tensors
``pack-quantized`` checkpoints, repacked at load into one layout.

Every format's tensors become, as they load (``int4_packing``), one byte per value and
output features first, so they shard like a 16-bit weight (``linear.Dims``):
``qvalue`` uint8 [N, K] (0..15), ``scales`` and ``zeros`` float32 [N, G], and with act-order
``g_idx`` int32 [K] (the group of each input feature). ``W[n, k] = (qvalue[n, k] -
zeros[n, g]) * scales[n, g]`` with ``g = g_idx[k]``, or ``k // group_size`` without
act-order. Groups shard with the input features they cover (a row-parallel rank's
features must be whole groups); with act-order any feature may use any group, so every
rank holds all of them, as the checkpoint has them.

After loading: with ``triton`` kernels the values are packed eight to an int32 for
``triton_w4a16.w4a16_matmul`` (4.5 bits a weight with the scales and zeros of groups of
128); otherwise the weight is dequantized once into the compute dtype and runs as a 16-bit
layer (on a CPU no 4-bit kernel of ours is faster than the packed 16-bit ones: the memory
is that of the 16-bit checkpoint).
"""

from collections.abc import Callable

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers.linear import (
    WEIGHT,
    Dims,
    LinearBase,
    LinearMethod,
    RowParallelLinear,
    Transform,
    UnquantizedLinearMethod,
    add_parameter,
    create_bias,
    take,
)
from kvserve.engine.quantization.config import Int4Scheme
from kvserve.engine.quantization.int4_packing import (
    AWQ_ORDER,
    unpack_along_columns,
    unpack_along_rows,
)

SIGNED_OFFSET = 8
"""compressed-tensors stores signed 4-bit values plus 8; a symmetric zero is 8 too."""


def _float(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.t().float()


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32)


def checkpoint_names(scheme: Int4Scheme) -> dict[str, tuple[str, Transform | None]]:
    """Each format's tensor names → (our parameter, its conversion)."""
    if scheme.layout == "awq":
        return {
            "qweight": ("qvalue", lambda t: unpack_along_columns(t, AWQ_ORDER).t()),
            "qzeros": ("zeros", lambda t: unpack_along_columns(t, AWQ_ORDER).t().float()),
            "scales": ("scales", _transposed),
        }
    if scheme.layout == "gptq":
        offset = scheme.zero_offset
        return {
            "qweight": ("qvalue", lambda t: unpack_along_rows(t).t()),
            "qzeros": ("zeros", lambda t: unpack_along_columns(t).t().float() + offset),
            "scales": ("scales", _transposed),
            "g_idx": ("g_idx", _int32),
        }
    return {
        "weight_packed": ("qvalue", unpack_along_columns),
        "weight_scale": ("scales", _float),
        "weight_zero_point": ("zeros", lambda t: unpack_along_rows(t).float()),
        "weight_g_idx": ("g_idx", _int32),
        "weight_shape": ("weight_shape", lambda t: t.to(torch.int64)),
    }


class Int4LinearMethod(LinearMethod):
    def __init__(self, scheme: Int4Scheme) -> None:
        self.scheme = scheme
        self.matmul: Callable[..., torch.Tensor] | None = None
        self.checkpoint_names = checkpoint_names(scheme)

    def create_weights(self, layer: LinearBase, bias: bool) -> None:
        scheme = self.scheme
        n, k, size = layer.out_features, layer.in_features, scheme.group_size
        if scheme.act_order:  # any feature may use any group: all of them on every rank
            full_k = k * layer.tp.size if isinstance(layer, RowParallelLinear) else k
            groups, group_dims = cdiv(full_k, size), Dims(input=None)
        else:
            groups, group_dims = cdiv(k, size), Dims(input_unit=size)
        add_parameter(layer, "qvalue", torch.empty(n, k, dtype=torch.uint8), WEIGHT)
        add_parameter(layer, "scales", torch.empty(n, groups, dtype=torch.float32), group_dims)
        if scheme.stores_zeros:
            add_parameter(layer, "zeros", torch.empty(n, groups, dtype=torch.float32), group_dims)
        if scheme.layout == "gptq" or scheme.act_order:  # GPTQ stores g_idx either way
            g_idx = torch.empty(k, dtype=torch.int32)
            add_parameter(layer, "g_idx", g_idx, Dims(output=None, input=0))
        if scheme.layout == "pack-quantized":
            shape = torch.zeros(2, dtype=torch.int64)
            add_parameter(layer, "weight_shape", shape, Dims(output=None, input=None, merge="max"))
        create_bias(layer, bias)

    def process_weights_after_loading(self, layer: LinearBase, kernels: str) -> None:
        qvalue = take(layer, "qvalue")
        k = qvalue.shape[1]
        if "weight_shape" in layer._parameters:
            full_k = k * layer.tp.size if isinstance(layer, RowParallelLinear) else k
            stored = int(take(layer, "weight_shape")[1])
            if stored != full_k:
                raise ValueError(
                    f"weight_shape says {stored} input features; the layer has {full_k}"
                )
        g_idx = self._g_idx(layer, k, qvalue.device)
        scales = take(layer, "scales")
        if self.scheme.stores_zeros:
            zeros = take(layer, "zeros")
        else:
            zeros = torch.full_like(scales, SIGNED_OFFSET)
        dtype = layer.compute_dtype
        if kernels == "triton":  # imported here: serving on a CPU never imports triton
            from kvserve.engine.kernels.triton_w4a16 import pack_int4, w4a16_matmul

            self.matmul = w4a16_matmul
            layer.register_buffer("qweight", pack_int4(qvalue))
            layer.register_buffer("scales_t", scales.t().to(dtype).contiguous())
            layer.register_buffer("zeros_t", zeros.t().to(dtype).contiguous())
            layer.register_buffer("g_index", g_idx)
            return
        g = g_idx.long()
        weight = (qvalue.float() - zeros[:, g]) * scales[:, g]
        add_parameter(layer, "weight", weight.to(dtype))
        layer.method = UnquantizedLinearMethod()
        layer.method.process_weights_after_loading(layer, kernels)

    def _g_idx(self, layer: LinearBase, k: int, device: torch.device) -> torch.Tensor:
        """This rank's group of each input feature: the checkpoint's with act-order, else
        ``k // group_size`` (a GPTQ checkpoint's g_idx is checked to say the same)."""
        size = self.scheme.group_size
        plain = torch.arange(k, dtype=torch.int32, device=device) // size
        if "g_idx" not in layer._parameters:
            return plain
        g_idx = take(layer, "g_idx")
        if self.scheme.act_order:
            return g_idx
        if not torch.equal(g_idx - g_idx[0], plain):
            raise ValueError(
                f"g_idx is not k // {size} though desc_act is false (an act-order "
                "checkpoint needs desc_act: true)"
            )
        return plain

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        assert self.matmul is not None  # the Triton path's, set once the weights loaded
        qweight, scales, zeros = (layer.get_buffer(n) for n in ("qweight", "scales_t", "zeros_t"))
        return self.matmul(x, qweight, scales, zeros, layer.get_buffer("g_index"), layer.bias)
