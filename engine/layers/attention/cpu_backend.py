"""The CPU path: C kernels for the cache writes, decode tokens and prefill chunks.

A paged cache hurts the torch path: it gathers every sequence's blocks into a padded copy
before attending, and attends one prefill chunk at a time. ``csrc/cpu_decode.c`` (one query
per sequence) and ``csrc/cpu_prefill.c`` (causal chunks, all of a step's in one call) read
keys and values in place through the block tables instead, on torch's own OpenMP threads
(see ``cpu_library``). Head sizes that are not a multiple of 16 take the torch path.
``csrc/cpu_store_kv.c`` writes a step's new keys and values straight from the strided views
of the qkv projection, one row copy per token. An e4m3 cache (``fp8_kv``) is written and read
by the same kernels, each in a variant of its own (a branch outside the 16-bit loops): the
store rounds each element, decode widens each block of rows to float32 as it reads it,
prefill as it packs its tiles; neither takes bf16 dot products then. Both take every
attention kind (window, sinks, soft-cap).
"""

import torch

from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.attention.fp8_kv import FP8, UNIT_SCALES, KVScales, is_fp8
from kvserve.engine.layers.attention.kind import AttentionKind
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.cpu_linear import dpbf16_linear
from kvserve.engine.layers.fused_ops import rows_of_heads

DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class CPUAttention(TorchAttention):
    """``TorchAttention`` with cache writes, decode tokens and prefill chunks handled by the
    C kernels, on ``isa`` (default: the widest SIMD path this CPU runs) and torch's intra-op
    thread count. ``bf16_dots``: bf16 prefill chunks, and decode tokens of models whose kv
    heads are grouped, take AVX-512-BF16 dot products for both products (default: wherever
    they run, the AVX-512 path of a CPU with AVX-512-BF16)."""

    name = "cpu"

    def __init__(self, isa: str | None = None, bf16_dots: bool | None = None) -> None:
        self.isa = isa or cpu_library.default_isa()
        if bf16_dots is None:
            cpu = torch.device("cpu")
            bf16_dots = self.isa == "avx512" and dpbf16_linear.can_use(torch.bfloat16, cpu)
        self.bf16_dots = bf16_dots

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping, kv_scales=UNIT_SCALES):
        if not (
            key.dtype in DTYPES
            and key.dtype == value.dtype
            and key_cache.dtype == value_cache.dtype in (key.dtype, FP8)
            and key_cache.device.type == "cpu"
            and rows_of_heads(key)
            and rows_of_heads(value)
            and key_cache.is_contiguous()
            and value_cache.is_contiguous()
            and slot_mapping.dtype == torch.int64
            and slot_mapping.is_contiguous()
        ):
            super().store_kv(key, value, key_cache, value_cache, slot_mapping, kv_scales)
            return
        cpu_library.run(
            "store_kv",
            key=key.data_ptr(),
            value=value.data_ptr(),
            key_cache=key_cache.data_ptr(),
            value_cache=value_cache.data_ptr(),
            slots=slot_mapping.data_ptr(),
            tokens=key.shape[0],
            row_len=key.shape[1] * key.shape[2],
            key_stride=key.stride(0),
            value_stride=value.stride(0),
            is_bf16=DTYPES[key.dtype],
            kv_fp8=int(is_fp8(key_cache)),
            k_inv_scale=1.0 / kv_scales.k,
            v_inv_scale=1.0 / kv_scales.v,
            num_threads=torch.get_num_threads(),
        )

    def _decode(
        self,
        query,
        key_cache,
        value_cache,
        meta,
        seqs: list[int],
        scale: float,
        kv_scales: KVScales,
        kind: AttentionKind,
    ):
        if not _kernels_take(query, key_cache):
            return super()._decode(
                query, key_cache, value_cache, meta, seqs, scale, kv_scales, kind
            )
        tables, seq_lens = _sequences(meta, seqs)
        if not rows_of_heads(query):
            query = query.contiguous()
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        self._run(
            "paged_decode",
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens=seq_lens.data_ptr(),
            out=out.data_ptr(),
            q_stride=query.stride(0),
            num_seqs=len(seqs),
            scale=scale,
            kv_scales=kv_scales,
            kind=kind,
        )
        return out

    def _prefill_chunks(
        self,
        query,
        out,
        key_cache,
        value_cache,
        meta,
        seqs: list[int],
        starts,
        scale: float,
        kv_scales: KVScales,
        kind: AttentionKind,
    ) -> None:
        if not _kernels_take(query, key_cache):
            super()._prefill_chunks(
                query, out, key_cache, value_cache, meta, seqs, starts, scale, kv_scales, kind
            )
            return
        if not seqs:
            return
        tables, seq_lens = _sequences(meta, seqs)
        query_starts = torch.tensor([starts[i] for i in seqs], dtype=torch.int32)
        query_lens = torch.tensor([meta.query_lens_host[i] for i in seqs], dtype=torch.int32)
        query = query.contiguous()
        assert out.is_contiguous()
        self._run(
            "paged_prefill",
            query,
            key_cache,
            value_cache,
            tables,
            seq_lens=seq_lens.data_ptr(),
            query_starts=query_starts.data_ptr(),
            query_lens=query_lens.data_ptr(),
            out=out.data_ptr(),
            num_seqs=len(seqs),
            scale=scale,
            kv_scales=kv_scales,
            kind=kind,
        )

    def _run(
        self,
        kernel: str,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        tables: torch.Tensor,
        kv_scales: KVScales,
        kind: AttentionKind,
        **args: int | float,
    ) -> None:
        """Attention kernel ``kernel`` on ``args`` and what both take alike: the query, the
        caches and block tables with their geometry, the dtype, whether the caches are e4m3
        (and their scales), whether bf16 dot products are taken (never over e4m3), the
        attention kind, torch's thread count and this SIMD path. The sinks are read in place
        (a recorded step replays their address): float32 and contiguous."""
        _, num_heads, head_dim = query.shape
        fp8 = is_fp8(key_cache)
        sinks = kind.sinks
        if sinks is not None and not (sinks.dtype == torch.float32 and sinks.is_contiguous()):
            raise ValueError("attention sinks must be a contiguous float32 tensor")
        cpu_library.run(
            kernel,
            q=query.data_ptr(),
            key_cache=key_cache.data_ptr(),
            value_cache=value_cache.data_ptr(),
            tables=tables.data_ptr(),
            num_heads=num_heads,
            num_kv_heads=key_cache.shape[2],
            head_dim=head_dim,
            block_size=key_cache.shape[1],
            table_stride=tables.shape[1],
            is_bf16=DTYPES[query.dtype],
            bf16_dots=int(self.bf16_dots and query.dtype == torch.bfloat16 and not fp8),
            kv_fp8=int(fp8),
            k_scale=kv_scales.k,
            v_scale=kv_scales.v,
            sinks=None if sinks is None else sinks.data_ptr(),
            window=kind.window or 0,
            softcap=kind.softcap or 0.0,
            num_threads=torch.get_num_threads(),
            isa=cpu_library.ISAS[self.isa],
            **args,
        )


def _kernels_take(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """Whether the C kernels take this step: float32 or bf16 on the CPU over a contiguous
    cache in that dtype or e4m3 (not a layer's slice of pages of several layers), head_dim
    a multiple of 16."""
    return (
        query.dtype in DTYPES
        and key_cache.dtype in (query.dtype, FP8)
        and key_cache.device.type == "cpu"
        and key_cache.is_contiguous()
        and query.shape[2] % 16 == 0
    )


def _sequences(meta, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The block tables and lengths of sequences ``seqs``, as the kernels take them."""
    if len(seqs) == meta.num_seqs:
        tables, seq_lens = meta.block_tables, meta.seq_lens
    else:
        index = torch.tensor(seqs)
        tables, seq_lens = meta.block_tables[index], meta.seq_lens[index]
    return tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
