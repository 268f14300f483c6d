"""FP8 (e4m3) linear layers, W8A8: compressed-tensors ``float-quantized``, Hugging Face
``fp8`` (block-wise or per-tensor), ModelOpt FP8, and 16-bit weights quantized as they load
(``--quantization fp8``).

Loaded layout, sharded like a 16-bit weight (``linear.Dims``): ``weight`` float8_e4m3fn
[N, K]; ``weight_scale`` float32, per output feature [N] (a per-tensor scale fills the rows
of its projection, so fused q/k/v keep each their own) or per block
[ceil(N / bn), ceil(K / bk)] (a rank's rows and columns must be whole blocks); with static
activations ``input_scale``, one float32 (the largest of a fused layer's parts, so the
activation fits every part's range). ``W = weight * scale``.

After loading: with ``triton`` kernels the layer multiplies in FP8
(``triton_fp8_gemm``: activations quantized per token, per token and block column, or by the
static scale); otherwise the weight is dequantized once into the compute dtype and runs as a
16-bit layer, activations unquantized (no FP8 arithmetic on a CPU: the memory is that of the
16-bit checkpoint).
"""

import functools
from collections.abc import Callable

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.kernels.fp8_quant import FP8_DTYPE, quantize_per_token
from kvserve.engine.layers.linear import (
    WEIGHT,
    Dims,
    LinearBase,
    LinearMethod,
    UnquantizedLinearMethod,
    add_parameter,
    create_bias,
    take,
)
from kvserve.engine.quantization.config import Fp8Scheme


def _fp8_weight(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != FP8_DTYPE:
        raise ValueError(f"an FP8 checkpoint's weight is float8_e4m3fn, this one is {t.dtype}")
    return t


def _float(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A per-channel scale ([N] or [N, 1]) or a per-tensor one ([], [1]) as a vector."""
    return t.float().reshape(-1)


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
) -> torch.Tensor:
    """``weight * scale`` in float32: per row, or per ``block`` of rows x columns."""
    if block is None:
        return weight.float() * scale[:, None]
    n, k = weight.shape
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return weight.float() * full[:n, :k]


class Fp8LinearMethod(LinearMethod):
    def __init__(self, scheme: Fp8Scheme) -> None:
        self.scheme = scheme
        self.matmul: Callable[..., torch.Tensor] | None = None
        self.static_scale: torch.Tensor | None = None  # the Triton path's, with static scales
        if not scheme.at_load:
            self.checkpoint_names = {
                "weight": ("weight", _fp8_weight),
                scheme.scale_name: ("weight_scale", _float if scheme.block else _flat),
                "input_scale": ("input_scale", _float),
            }

    def create_weights(self, layer: LinearBase, bias: bool) -> None:
        scheme = self.scheme
        if scheme.at_load:
            UnquantizedLinearMethod().create_weights(layer, bias)
            return
        n, k = layer.out_features, layer.in_features
        add_parameter(layer, "weight", torch.empty(n, k, dtype=FP8_DTYPE), WEIGHT)
        if scheme.block is not None:
            rows, cols = scheme.block
            scale = torch.empty(cdiv(n, rows), cdiv(k, cols), dtype=torch.float32)
            add_parameter(layer, "weight_scale", scale, Dims(output_unit=rows, input_unit=cols))
        else:
            scale = torch.empty(n, dtype=torch.float32)
            add_parameter(layer, "weight_scale", scale, Dims(input=None))
        if scheme.activations == "static":
            static = torch.zeros((), dtype=torch.float32)
            add_parameter(layer, "input_scale", static, Dims(output=None, input=None, merge="max"))
        create_bias(layer, bias)

    def process_weights_after_loading(self, layer: LinearBase, kernels: str) -> None:
        if self.scheme.at_load:  # per output channel: each row's largest magnitude at 448
            weight, scale = quantize_per_token(take(layer, "weight"))
            scale = scale.reshape(-1)
        else:
            weight, scale = take(layer, "weight"), take(layer, "weight_scale")
        static = take(layer, "input_scale") if "input_scale" in layer._parameters else None
        if kernels == "triton":  # imported here: serving on a CPU never imports triton
            from kvserve.engine.kernels import triton_fp8_gemm

            block = self.scheme.block
            if block is None:
                self.matmul = triton_fp8_gemm.fp8_matmul
            else:
                self.matmul = functools.partial(triton_fp8_gemm.fp8_block_matmul, block=block)
            layer.register_buffer("weight_fp8", weight)
            layer.register_buffer("scale", scale)
            self.static_scale = static
            return
        dense = dequantize(weight, scale, self.scheme.block)
        add_parameter(layer, "weight", dense.to(layer.compute_dtype))
        layer.method = UnquantizedLinearMethod()
        layer.method.process_weights_after_loading(layer, kernels)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        assert self.matmul is not None  # the Triton path's, set once the weights loaded
        weight, scale = layer.get_buffer("weight_fp8"), layer.get_buffer("scale")
        if self.scheme.block is not None:
            return self.matmul(x, weight, scale, bias=layer.bias)
        return self.matmul(x, weight, scale, self.static_scale, layer.bias)
