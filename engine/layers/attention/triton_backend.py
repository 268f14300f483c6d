"""Paged attention through the Triton kernels: the CUDA path (and the interpreter's on CPU)."""

from dataclasses import dataclass, replace

import torch
import triton

from kvserve.engine.kernels.triton_attention import (
    merge_splits_kernel,
    paged_attention_kernel,
    store_kv_kernel,
)
from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.fp8_kv import UNIT_SCALES, KVScales, is_fp8
from kvserve.engine.layers.attention.kind import PLAIN, AttentionKind
from kvserve.engine.layers.attention.metadata import AttentionMetadata

MIN_DOT = 16  # tl.dot needs every dimension >= 16 on a GPU
PREFILL_BLOCK_M = 64
BLOCK_N = 32
DECODE_BLOCK_N = 64
DECODE_TILE_PER_TWO_WARPS = 16 * 128  # row tile elements (rows x padded head dims)
DECODE_PROGRAMS = 512  # about four per SM on an H100/H200 (132 SMs)
MAX_SPLITS = 32
NUM_STAGES = 3  # Triton's default software pipelining depth on CUDA
INT32_OFFSETS = 2**31 - 1  # the most cache elements that 32-bit offsets address


@dataclass(frozen=True)
class AttentionLaunch:
    """Tile shapes and grid of one ``paged_attention_kernel`` launch; every tile size is a
    power of two and each ``tl.dot`` dimension (``block_m``, ``block_n``, ``head_pad``) is
    at least 16."""

    group: int
    group_pad: int
    head_dim: int
    head_pad: int
    block_q: int
    block_n: int
    num_warps: int
    num_seqs: int
    num_kv_heads: int
    q_tiles: int
    num_splits: int
    num_stages: int = NUM_STAGES
    native_dots: bool = False

    @property
    def block_m(self) -> int:
        return self.block_q * self.group_pad

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.num_seqs, self.num_kv_heads, self.q_tiles * self.num_splits)

    def constants(
        self,
        block_size: int,
        dtype: torch.dtype,
        cache_elements: int,
        kv_fp8: bool = False,
        kind: AttentionKind = PLAIN,
    ) -> dict[str, int | str]:
        """The kernel's compile-time arguments for ``dtype`` activations over caches of
        ``block_size`` holding ``cache_elements`` each (beyond ``INT32_OFFSETS`` they take
        64-bit offsets), e4m3 if ``kv_fp8``, for attention of ``kind``."""
        return dict(
            BLOCK_SIZE=block_size,
            GROUP=self.group,
            GROUP_PAD=self.group_pad,
            HEAD_DIM=self.head_dim,
            HEAD_PAD=self.head_pad,
            BLOCK_Q=self.block_q,
            BLOCK_N=self.block_n,
            NUM_SPLITS=self.num_splits,
            DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
            NATIVE_DOTS=self.native_dots,
            WIDE_OFFSETS=cache_elements > INT32_OFFSETS,
            KV_FP8=kv_fp8,
            SLIDING=kind.window is not None,
            SINKS=kind.sinks is not None,
            SOFTCAP=kind.softcap is not None,
        )


def attention_launch(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int,
    dtype: torch.dtype,
    window: int | None = None,
) -> AttentionLaunch:
    """Decode-only batches (``max_query_len == 1``) get the smallest row tile, 16 rows,
    filled with the GQA group; batches with prefill chunks get 64 rows, several tokens
    each. A 16-bit decode launch takes 64-key tiles (32 past 128 dimensions), native-dtype
    dots and two warps per 16 x 128 of row tile: on an H200 this halved decode attention
    at batch 16 to 256 (``benchmarks/attention_sweep.py``, ``benchmarks/gpu-levers.md``
    lever G3). Other launches take 32-key tiles, fp32 dots and 8 warps for the larger
    tiles. Every supported shape stays within the registers on sm_90
    (tests/test_triton_compile.py). A decode batch of fewer than ``DECODE_PROGRAMS``
    (sequence, kv head) pairs splits each context into a power of two of key ranges, up to
    ``MAX_SPLITS``, so that about that many programs share the work, but no more ranges
    than key tiles in a sliding ``window``. Depends on host integers only, so a decode
    launch has a fixed grid for a CUDA graph."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    decode = max_query_len == 1
    native = decode and dtype.itemsize == 2
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = max(MIN_DOT if decode else PREFILL_BLOCK_M, group_pad)
    block_q = block_m // group_pad
    head_pad = max(MIN_DOT, triton.next_power_of_2(head_dim))
    if native:
        num_warps = min(8, 2 * max(1, block_m * head_pad // DECODE_TILE_PER_TWO_WARPS))
        block_n = DECODE_BLOCK_N if head_pad <= 128 else DECODE_BLOCK_N // 2
    else:
        num_warps = 8 if head_pad >= 128 or block_m >= PREFILL_BLOCK_M else 4
        block_n = BLOCK_N
    pairs = num_seqs * num_kv_heads
    splits = 1 if not decode else min(MAX_SPLITS, max(1, DECODE_PROGRAMS // pairs))
    if window is not None:
        splits = min(splits, triton.cdiv(window, block_n))
    return AttentionLaunch(
        group=group,
        group_pad=group_pad,
        head_dim=head_dim,
        head_pad=head_pad,
        block_q=block_q,
        block_n=block_n,
        num_warps=num_warps,
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        q_tiles=triton.cdiv(max_query_len, block_q),
        num_splits=1 << (splits.bit_length() - 1),
        native_dots=native,
    )


def store_kv_constants(
    block_size: int, num_kv_heads: int, head_dim: int, kv_fp8: bool = False
) -> dict[str, int]:
    """``store_kv_kernel``'s compile-time arguments."""
    return dict(
        BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_PAD=triton.next_power_of_2(head_dim),
        KV_FP8=kv_fp8,
    )


class TritonAttention(AttentionBackend):
    """One store kernel launch and one attention kernel launch per layer, whatever the mix
    of prefill chunks and decode tokens (and a merge launch for a decode batch whose keys
    are split); no host-device synchronisation."""

    name = "triton"

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping, kv_scales=UNIT_SCALES):
        num_tokens, num_kv_heads, head_dim = key.shape
        _check_caches(key_cache, value_cache)
        if key.stride(-1) != 1 or value.stride(-1) != 1:
            raise ValueError("key and value need a unit stride on the head dimension")
        store_kv_kernel[(num_tokens,)](
            key,
            value,
            key_cache,
            value_cache,
            slot_mapping,
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            1.0 / kv_scales.k,
            1.0 / kv_scales.v,
            **store_kv_constants(key_cache.shape[1], num_kv_heads, head_dim, is_fp8(key_cache)),
        )

    def attend(
        self,
        query,
        key_cache,
        value_cache,
        meta: AttentionMetadata,
        scale,
        kv_scales=UNIT_SCALES,
        *,
        window=None,
        sinks=None,
        softcap=None,
    ):
        num_heads, head_dim = query.shape[1:]
        launch = attention_launch(
            meta.num_seqs,
            num_heads,
            key_cache.shape[2],
            head_dim,
            meta.max_query_len,
            query.dtype,
            window,
        )
        if is_fp8(key_cache) or (query.device.type == "cpu" and query.dtype == torch.bfloat16):
            # e4m3 keys and values are upcast; Triton's interpreter multiplies bf16 dot
            # operands as raw 16-bit patterns.
            launch = replace(launch, native_dots=False)
        kind = AttentionKind(window, sinks, softcap)
        return paged_attention(launch, query, key_cache, value_cache, meta, scale, kv_scales, kind)


def paged_attention(
    launch: AttentionLaunch,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_scales: KVScales = UNIT_SCALES,
    kind: AttentionKind = PLAIN,
) -> torch.Tensor:
    """``paged_attention_kernel`` as ``launch`` says, then ``merge_splits_kernel`` if the
    launch splits the keys; the split buffers are fp32, one row per query row and split.
    An e4m3 cache's key scale goes in folded into ``scale``; a 16-bit cache ignores
    ``kv_scales``. Attention of ``kind``: its sinks as fp32 on the query's device."""
    _check_caches(key_cache, value_cache)
    if query.stride(-1) != 1 or meta.block_tables.stride(-1) != 1:
        raise ValueError("query and block tables need a unit stride on their last dimension")
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    fp8 = is_fp8(key_cache)
    splits = launch.num_splits
    split_acc = split_max = split_sum = out  # a one-split launch never touches them
    if splits > 1:
        rows = (num_tokens, num_heads, splits)
        split_max, split_sum = (
            torch.empty(rows, dtype=torch.float32, device=query.device) for _ in range(2)
        )
        split_acc = torch.empty((*rows, head_dim), dtype=torch.float32, device=query.device)
    paged_attention_kernel[launch.grid](
        out,
        split_acc,
        split_max,
        split_sum,
        query,
        key_cache,
        value_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scale * kv_scales.k if fp8 else scale,
        kv_scales.v,
        out if kind.sinks is None else kind.sinks,
        kind.window or 0,
        kind.softcap or 0.0,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        meta.block_tables.stride(0),
        **launch.constants(key_cache.shape[1], query.dtype, key_cache.numel(), fp8, kind),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    if splits > 1:
        merge_splits_kernel[(num_tokens, num_heads)](
            out,
            split_acc,
            split_max,
            split_sum,
            out.stride(0),
            out.stride(1),
            NUM_SPLITS=splits,
            HEAD_DIM=head_dim,
            HEAD_PAD=launch.head_pad,
        )
    return out


def _check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """The kernels address both caches with the key cache's strides."""
    if key_cache.shape != value_cache.shape or key_cache.stride() != value_cache.stride():
        raise ValueError("key and value caches must share shape and strides")
    if key_cache.stride(-1) != 1:
        raise ValueError("KV caches need a unit stride on the head dimension")
