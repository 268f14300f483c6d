"""Batched LoRA on the GPU: the shrink and the expand of a step's rows grouped by adapter
slot (``LoRASegments``), two Triton kernels, one launch each per layer whatever the number
of adapters in the batch.

Layouts (``LoRALinear``'s stacks, padded to the rank ``R = max_rank``):

- A ``[slots, parts * R, K]``: part ``p`` of a fused projection (q/k/v, gate/up) in rows
  ``p * R .. p * R + R``.
- B ``[slots, N, parts * R]``: part ``p`` writes output features ``offsets[p] ..
  offsets[p] + sizes[p]`` from rank columns ``p * R .. p * R + R``. Only these diagonal
  blocks are read (``LoRALinear`` keeps the rest zero for its CPU path's one matmul).

Shrink: ``shrunk[row, p * R + j] = x[row] . A[slot(row), p * R + j]``, float32, for the
rows in a group; program ``(m tile * SPLIT_K + split, part, group)``. A decode step has few
rows per adapter, so the K loop is split until about ``SPLIT_K_TARGET_PROGRAMS`` programs
run, their partial sums added atomically into a zeroed ``shrunk``. Expand: ``out[row,
offsets[p] + n] += scale * shrunk[row, p * R : p * R + R] . B[slot(row), offsets[p] + n,
p * R : p * R + R]``, in place, the sum rounded once to ``out``'s dtype; program ``(m tile *
n tiles + n tile, part, group)``. Programs past their group's rows or their part's features
return at once. Rows of the base model are in no group and are never touched.

Products accumulate in float32: native fp16/bf16 dots on the GPU, fp32 dots for float32 and
under Triton's interpreter for bf16 (which multiplies bf16 dot operands as raw 16-bit
patterns).
"""

from typing import Any

import torch
import triton
import triton.language as tl

from .lora_segments import LoRASegments

SPLIT_K_TARGET_PROGRAMS = 256  # about two per SM of an H100/H200 (132)
BLOCK_K = 64
BLOCK_N = 64


@triton.jit
def lora_shrink_kernel(
    x_ptr,
    a_ptr,
    out_ptr,
    rows_ptr,
    starts_ptr,
    lengths_ptr,
    slots_ptr,
    K,
    k_span,
    stride_xm,
    stride_as,
    stride_ar,
    stride_om,
    RANK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NATIVE_DOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[rows, part * RANK + ranks] (+)= x[rows, ks] @ A[slot, part * RANK + ranks,
    ks]ᵀ`` over split's ``k_span`` input features (a multiple of ``BLOCK_K``)."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    group = tl.program_id(2)
    m_tile = pid // SPLIT_K
    split = pid % SPLIT_K
    length = tl.load(lengths_ptr + group)
    if m_tile * BLOCK_M >= length:
        return
    start = tl.load(starts_ptr + group)
    slot = tl.load(slots_ptr + group).to(tl.int64)
    offs = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs < length
    rows = tl.load(rows_ptr + start + offs, mask=row_valid, other=0).to(tl.int64)
    ranks = tl.arange(0, BLOCK_R)
    rank_valid = ranks < RANK
    a_rows = (part * RANK + ranks).to(tl.int64)
    a_base = a_ptr + slot * stride_as
    k_start = split * k_span
    k_end = tl.minimum(K, k_start + k_span)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_valid = ks < k_end
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :],
            mask=row_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        a = tl.load(
            a_base + a_rows[None, :] * stride_ar + ks[:, None],
            mask=k_valid[:, None] & rank_valid[None, :],
            other=0.0,
        )
        if NATIVE_DOTS:
            acc += tl.dot(x, a)
        else:
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
    out = out_ptr + rows[:, None] * stride_om + (part * RANK + ranks)[None, :]
    mask = row_valid[:, None] & rank_valid[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc, mask=mask)
    else:
        tl.atomic_add(out, acc, mask=mask)


@triton.jit
def lora_expand_kernel(
    shrunk_ptr,
    b_ptr,
    out_ptr,
    rows_ptr,
    starts_ptr,
    lengths_ptr,
    slots_ptr,
    offsets_ptr,
    sizes_ptr,
    scale,
    n_tiles,
    stride_sm,
    stride_bs,
    stride_bn,
    stride_om,
    RANK: tl.constexpr,
    NATIVE_DOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """``out[rows, offsets[part] + cols] += scale * shrunk[rows, part * RANK + ranks] @
    B[slot, offsets[part] + cols, part * RANK + ranks]ᵀ``."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    group = tl.program_id(2)
    m_tile = pid // n_tiles
    n_tile = pid % n_tiles
    length = tl.load(lengths_ptr + group)
    size = tl.load(sizes_ptr + part)
    if (m_tile * BLOCK_M >= length) | (n_tile * BLOCK_N >= size):
        return
    start = tl.load(starts_ptr + group)
    slot = tl.load(slots_ptr + group).to(tl.int64)
    offset = tl.load(offsets_ptr + part)
    offs = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs < length
    rows = tl.load(rows_ptr + start + offs, mask=row_valid, other=0).to(tl.int64)
    ranks = tl.arange(0, BLOCK_R)
    rank_valid = ranks < RANK
    rank_cols = part * RANK + ranks
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < size
    features = (offset + cols).to(tl.int64)
    shrunk = tl.load(
        shrunk_ptr + rows[:, None] * stride_sm + rank_cols[None, :],
        mask=row_valid[:, None] & rank_valid[None, :],
        other=0.0,
    )
    b = tl.load(
        b_ptr + slot * stride_bs + features[None, :] * stride_bn + rank_cols[:, None],
        mask=rank_valid[:, None] & col_valid[None, :],
        other=0.0,
    )
    if NATIVE_DOTS:
        acc = tl.dot(shrunk.to(b.dtype), b)
    else:
        acc = tl.dot(shrunk, b.to(tl.float32), input_precision="ieee")
    dst = out_ptr + rows[:, None] * stride_om + features[None, :]
    mask = row_valid[:, None] & col_valid[None, :]
    current = tl.load(dst, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (current + scale * acc).to(out_ptr.dtype.element_ty), mask=mask)


def launch_constants(rank: int, max_length: int, native_dots: bool) -> dict[str, Any]:
    """The constants both kernels take: ``BLOCK_M`` 16 rows for a decode step's groups
    (``max_length``: the longest), 64 past them; ``BLOCK_R`` the rank padded to a power of
    two of at least 16 (a dot's least side)."""
    return dict(
        RANK=rank,
        NATIVE_DOTS=native_dots,
        BLOCK_M=16 if max_length <= 16 else 64,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
    )


def _native_dots(x: torch.Tensor) -> bool:
    return x.dtype == torch.float16 or (x.dtype == torch.bfloat16 and x.is_cuda)


def shrink_split(k: int, programs: int) -> tuple[int, int]:
    """(splits of the K loop, input features each) so that ``programs`` (m tiles × parts ×
    groups) times the splits reach about ``SPLIT_K_TARGET_PROGRAMS``."""
    k_blocks = triton.cdiv(k, BLOCK_K)
    wanted = max(1, min(k_blocks, SPLIT_K_TARGET_PROGRAMS // max(programs, 1)))
    k_span = triton.cdiv(k_blocks, wanted) * BLOCK_K
    return triton.cdiv(k, k_span), k_span


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    segments: LoRASegments,
    num_parts: int,
    rank: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """``x`` ``[M, K]``, ``lora_a`` ``[slots, num_parts * rank, K]`` → float32 ``[M,
    num_parts * rank]``, filled in the rows of ``segments`` (the others are zero or
    unset). ``split_k`` (default: ``shrink_split``'s) splits the K loop."""
    m, k = x.shape
    if x.stride(1) != 1 or lora_a.stride(2) != 1 or lora_a.shape[1:] != (num_parts * rank, k):
        raise ValueError(
            f"lora_shrink: x {list(x.shape)} and A {list(lora_a.shape)} must have contiguous "
            f"input features and A {num_parts} parts of rank {rank} over {k} features"
        )
    constants = launch_constants(rank, segments.max_length, _native_dots(x))
    m_tiles = triton.cdiv(segments.max_length, constants["BLOCK_M"])
    programs = m_tiles * num_parts * segments.num_groups
    if split_k is None:
        split_k, k_span = shrink_split(k, programs)
    else:
        k_span = triton.cdiv(triton.cdiv(k, BLOCK_K), split_k) * BLOCK_K
    alloc = torch.zeros if split_k > 1 else torch.empty
    out = alloc(m, num_parts * rank, dtype=torch.float32, device=x.device)
    grid = (m_tiles * split_k, num_parts, segments.num_groups)
    lora_shrink_kernel[grid](
        x,
        lora_a,
        out,
        segments.rows,
        segments.starts,
        segments.lengths,
        segments.slots,
        k,
        k_span,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        out.stride(0),
        SPLIT_K=split_k,
        BLOCK_K=BLOCK_K,
        **constants,
    )
    return out


def lora_expand(
    out: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    segments: LoRASegments,
    part_offsets: torch.Tensor,
    part_sizes: torch.Tensor,
    max_size: int,
    rank: int,
    scale: float = 1.0,
) -> None:
    """Add ``scale`` times each part's ``shrunk @ B``ᵀ into ``out`` ``[M, N]``'s features of
    that part, in the rows of ``segments``. ``lora_b`` ``[slots, N, parts * rank]``;
    ``part_offsets`` and ``part_sizes`` int32 ``[parts]`` on the device, ``max_size`` the
    largest size (on the host)."""
    num_parts = part_offsets.shape[0]
    if (
        out.stride(1) != 1
        or shrunk.stride(1) != 1
        or lora_b.stride(2) != 1
        or lora_b.shape[1:] != (out.shape[1], num_parts * rank)
        or shrunk.shape != (out.shape[0], num_parts * rank)
    ):
        raise ValueError(
            f"lora_expand: out {list(out.shape)}, shrunk {list(shrunk.shape)} and B "
            f"{list(lora_b.shape)} must agree on {num_parts} parts of rank {rank}, with "
            "contiguous output features and ranks"
        )
    constants = launch_constants(rank, segments.max_length, _native_dots(out))
    n_tiles = triton.cdiv(max_size, BLOCK_N)
    m_tiles = triton.cdiv(segments.max_length, constants["BLOCK_M"])
    grid = (m_tiles * n_tiles, num_parts, segments.num_groups)
    lora_expand_kernel[grid](
        shrunk,
        lora_b,
        out,
        segments.rows,
        segments.starts,
        segments.lengths,
        segments.slots,
        part_offsets,
        part_sizes,
        scale,
        n_tiles,
        shrunk.stride(0),
        lora_b.stride(0),
        lora_b.stride(1),
        out.stride(0),
        BLOCK_N=BLOCK_N,
        **constants,
    )
