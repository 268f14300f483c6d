"""The weight method of each linear layer under a checkpoint's ``QuantConfig``."""

from kvserve.engine.layers.linear import LinearMethod
from kvserve.engine.quantization.config import Fp8Scheme, Mxfp4Scheme, QuantConfig
from kvserve.engine.quantization.fp8_method import Fp8LinearMethod
from kvserve.engine.quantization.int4_method import Int4LinearMethod


def linear_method(quant: QuantConfig | None, names: list[str]) -> LinearMethod | None:
    """The method of the layer that holds the checkpoint's projections ``names`` (several
    for a fused layer); None: unquantized."""
    if quant is None or isinstance(quant.scheme, Mxfp4Scheme) or not quant.quantizes(names):
        return None
    if isinstance(quant.scheme, Fp8Scheme):
        return Fp8LinearMethod(quant.scheme)
    return Int4LinearMethod(quant.scheme)
