"""The decoder's elementwise ops: RMSNorm (with the residual add before it), SiLU-and-mul
and RoPE. On a CPU each is one pass of the C kernels in ``csrc/cpu_fused.c``; on a CUDA
device one Triton kernel (``triton_fused``); elsewhere, or for a layout the kernels do not
take, the torch expressions below run (the reference the kernels are tested against:
float32 equal to rounding, bf16 within one unit in the last place). ``isa`` picks the C
kernels' SIMD path (default: the widest this CPU runs)."""

import torch
import torch.nn.functional as F

from kvserve.engine.kernels import cpu_library

DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _kernels(*tensors: torch.Tensor):
    """The C library if it serves these tensors (CPU, float32 or bf16, one dtype)."""
    first = tensors[0]
    if first.device.type != "cpu" or first.dtype not in DTYPES:
        return None
    if any(t.dtype != first.dtype or t.device != first.device for t in tensors):
        return None
    return cpu_library.load()


def _triton_fused():
    """The Triton kernels, imported on first use: a process on a CPU never loads Triton."""
    from kvserve.engine.kernels import triton_fused

    return triton_fused


def takes_rows(*tensors: torch.Tensor) -> bool:
    """Layouts of the Triton kernels: 2-D tensors with a unit stride on the last dimension."""
    return all(t.dim() == 2 and t.stride(1) == 1 for t in tensors)


def takes_heads(q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor) -> bool:
    """The Triton ``rope``'s layouts: 3-D heads with a unit last stride, an even head_dim,
    and a contiguous table."""
    return (
        q.dim() == k.dim() == 3
        and q.stride(2) == k.stride(2) == 1
        and q.shape[2] % 2 == 0
        and cos_sin.is_contiguous()
    )


def _isa(isa: str | None) -> str:
    return isa or cpu_library.default_isa()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    isa: str | None = None,
) -> torch.Tensor:
    """``weight * rmsnorm(residual + x)`` over the last dimension, where ``residual`` (if
    given) is updated in place to ``residual + x`` (in its dtype) first; else of ``x``.
    The C kernel also takes, without a residual, heads packed in strided token rows
    (``rows_of_heads``: Qwen3's q and k norms on their views of the qkv output); the
    output is contiguous."""
    rows = (x,) if residual is None else (x, residual)
    if x.is_cuda and weight.dtype == x.dtype and takes_rows(*rows):
        return _triton_fused().rms_norm(x, weight, eps, residual)
    lib = _kernels(*rows, weight)
    plain = all(t.is_contiguous() for t in rows)
    packed_heads = residual is None and rows_of_heads(x)
    if lib is None or not weight.is_contiguous() or not (plain or packed_heads):
        return rms_norm_reference(x, weight, eps, residual)
    out = x.new_empty(x.shape)
    n = x.shape[-1]
    heads, token_stride = (1, n) if plain else (x.shape[1], x.stride(0))
    isa = _isa(isa)
    cpu_library.run(
        "add_rms_norm",
        x=x.data_ptr(),
        residual=None if residual is None else residual.data_ptr(),
        weight=weight.data_ptr(),
        out=out.data_ptr(),
        rows=x.numel() // n,
        n=n,
        heads=heads,
        x_token_stride=token_stride,
        eps=eps,
        is_bf16=DTYPES[x.dtype],
        num_threads=torch.get_num_threads(),
        isa=cpu_library.ISAS[isa],
    )
    return out


def silu_and_mul(gate_up: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` along the last dimension."""
    if gate_up.is_cuda and takes_rows(gate_up):
        return _triton_fused().silu_and_mul(gate_up)
    lib = _kernels(gate_up)
    if lib is None or not gate_up.is_contiguous():
        return silu_and_mul_reference(gate_up)
    n = gate_up.shape[-1] // 2
    out = gate_up.new_empty((*gate_up.shape[:-1], n))
    isa = _isa(isa)
    cpu_library.run(
        "silu_and_mul",
        gate_up=gate_up.data_ptr(),
        out=out.data_ptr(),
        rows=gate_up.numel() // (2 * n),
        n=n,
        is_bf16=DTYPES[gate_up.dtype],
        num_threads=torch.get_num_threads(),
        isa=cpu_library.ISAS[isa],
    )
    return out


def rows_of_heads(x: torch.Tensor) -> bool:
    """``[tokens, heads, head_dim]`` with each token's heads packed in one strided row."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin: torch.Tensor,
    isa: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` ``[tokens, heads, head_dim]`` rotated by ``positions`` (half-split
    layout) with ``cos_sin`` ``[2, max_positions, head_dim]``. The kernels (C and Triton)
    rotate in place and return the same tensors; the torch path returns new ones."""
    if q.is_cuda and takes_heads(q, k, cos_sin):
        return _triton_fused().rope(positions, q, k, cos_sin)
    lib = _kernels(q, k, cos_sin)
    if (
        lib is None
        or positions.dtype != torch.int64
        or not (positions.is_contiguous() and cos_sin.is_contiguous())
        or not (rows_of_heads(q) and rows_of_heads(k))
    ):
        return rope_reference(positions, q, k, cos_sin)
    isa = _isa(isa)
    cpu_library.run(
        "rope",
        q=q.data_ptr(),
        k=k.data_ptr(),
        positions=positions.data_ptr(),
        cos_sin=cos_sin.data_ptr(),
        tokens=q.shape[0],
        q_heads=q.shape[1],
        k_heads=k.shape[1],
        head_dim=q.shape[2],
        q_stride=q.stride(0),
        k_stride=k.stride(0),
        max_positions=cos_sin.shape[1],
        is_bf16=DTYPES[q.dtype],
        num_threads=torch.get_num_threads(),
        isa=cpu_library.ISAS[isa],
    )
    return q, k


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    if residual is not None:
        x = residual.add_(x)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_reference(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin[:, positions].unsqueeze(2)  # [T, 1, D] each
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
