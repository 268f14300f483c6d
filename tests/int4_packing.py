"""The int32 layouts of 4-bit checkpoints: AutoAWQ's GEMM packing and AutoGPTQ's (v1) packing.

Eight 4-bit values share one int32 word; nibble i is bits 4i..4i+3 (nibble 0 the lowest).

AutoAWQ GEMM (quant_method "awq", version "gemm"), for a linear with weight [N, K] (out, in):
    qweight int32 [K, N/8]: row k, word c holds q[k, 8c + AWQ_ORDER[i]] in nibble i
    qzeros  int32 [K/G, N/8]: the zero points, the same interleaved order
    scales  fp16  [K/G, N]
    weight = (q - zero) * scale, with q and zero in [0, 15].

AutoGPTQ (quant_method "gptq", checkpoint_format "gptq"):
    qweight int32 [K/8, N]: word r of column n holds q[8r + i, n] in nibble i (packed along K)
    qzeros  int32 [K/G, N/8]: word c of group g holds zero[g, 8c + i] - 1 in nibble i
            (GPTQ v1 stores the zero point minus one, so a zero point of 0 cannot be stored)
    scales  fp16  [K/G, N]
    g_idx   int32 [K]: the group of each input column, k // G, or the act-order groups
    weight[n, k] = (q[k, n] - zero[g_idx[k], n]) * scales[g_idx[k], n].
"""

import torch

from quant_math import Int4Groups

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column AWQ_ORDER[i] of its 8
SEQUENTIAL_ORDER = tuple(range(8))


def pack_nibbles(values: torch.Tensor, order: tuple[int, ...] = SEQUENTIAL_ORDER) -> torch.Tensor:
    """Values in [0, 15] [R, C] → int32 [R, C/8]: word c holds ``values[:, 8c + order[i]]``
    in nibble i (the int32 is the word's bit pattern, so nibble 7 sets the sign)."""
    eights = values.long().unflatten(1, (-1, 8))[..., list(order)]
    words = (eights << (4 * torch.arange(8))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def awq_tensors(groups: Int4Groups) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM's qweight, qzeros and scales (module docstring) of ``groups``."""
    return {
        "qweight": pack_nibbles(groups.q.T, AWQ_ORDER),
        "qzeros": pack_nibbles(groups.zero.T, AWQ_ORDER),
        "scales": groups.scale.T.to(torch.float16).contiguous(),
    }


def gptq_tensors(groups: Int4Groups) -> dict[str, torch.Tensor]:
    """AutoGPTQ's qweight, qzeros, scales and g_idx (module docstring) of ``groups``."""
    if int(groups.zero.min()) < 1:
        raise ValueError("GPTQ v1 stores zero - 1: a zero point of 0 does not fit")
    return {
        "qweight": pack_nibbles(groups.q).T.contiguous(),
        "qzeros": pack_nibbles(groups.zero.T - 1),
        "scales": groups.scale.T.to(torch.float16).contiguous(),
        "g_idx": groups.g_idx.to(torch.int32),
    }
