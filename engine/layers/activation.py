"""Gated activations of a ``[..., 2n]`` gate/up row (gate first, then up) → ``[..., n]``
beside ``fused_ops.silu_and_mul``."""

import torch
import torch.nn.functional as F

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def swigluoai_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU (vLLM's ``swigluoai``): the gate clamped above at 7, the up
    to ±7, then ``(up + 1) * gate * sigmoid(1.702 * gate)``, in transformers' order."""
    n = gate_up.shape[-1] // 2
    gate = gate_up[..., :n].clamp(max=SWIGLU_LIMIT)
    up = gate_up[..., n:].clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
    return (up + 1) * (gate * torch.sigmoid(gate * SWIGLU_ALPHA))


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma's): ``gelu_tanh(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
