"""The FP8 KV cache (``--kv-cache-dtype fp8``): keys and values stored as e4m3 bytes.

A layer's key cache holds ``key / k_scale`` and its value cache ``value / v_scale``, each
rounded to the nearest e4m3 value (ties to even) after clamping to ±``FP8_MAX``; attention
reads back ``stored * scale``. The scales are per tensor: one for the keys and one for the
values of each layer, from the checkpoint where it has them, else 1.0 (as vLLM does). Every
backend quantizes as ``quantize`` does, multiplying by the reciprocal of the scale (so that
the C and Triton stores give the same bytes as this one). The torch path reads ``dequantize``d
copies; the C and Triton kernels widen e4m3 exactly and fold the scales into the attention
instead: the keys' into the softmax scale, the values' into the output.
"""

from typing import NamedTuple

import torch

from kvserve.engine.config import KV_CACHE_DTYPES

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
"""The largest finite e4m3 value; e4m3fn has no infinities."""


class KVScales(NamedTuple):
    """One layer's per-tensor scales: a cached key is ``stored * k``, a value ``stored * v``
    (ignored by a cache in the model's dtype)."""

    k: float = 1.0
    v: float = 1.0


UNIT_SCALES = KVScales()


def kv_cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for ``--kv-cache-dtype`` ``setting``: the model's for
    ``auto``, e4m3 for the others (``fp8``, ``fp8_e4m3``)."""
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {setting!r}")
    return model_dtype if setting == "auto" else FP8


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` as e4m3: multiplied in float32 by the reciprocal, clamped, rounded."""
    return (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The values an e4m3 tensor stands for, ``stored * scale``, in ``dtype``."""
    return (stored.float() * scale).to(dtype)
