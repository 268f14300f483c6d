"""The CPU path: C kernels for decode tokens and for prefill chunks.

A paged cache hurts the torch path: it gathers every sequence's blocks into a padded copy
before attending, and attends one prefill chunk at a time. ``csrc/cpu_decode.c`` (one query
per sequence) and ``csrc/cpu_prefill.c`` (causal chunks, all of a step's in one call) read
keys and values in place through the block tables instead, on torch's own OpenMP threads
(see ``cpu_library``). Head sizes that are not a multiple of 16 prefill on the torch path.
"""

import torch

from kvserve.engine import cpu_library
from kvserve.engine.attention.torch_backend import TorchAttention

DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class CPUAttention(TorchAttention):
    """``TorchAttention`` with decode tokens and prefill chunks handled by the C kernels, on
    ``isa`` (default: the widest SIMD path this CPU runs) and torch's intra-op thread
    count."""

    name = "cpu"

    def __init__(self, isa: str | None = None) -> None:
        self.isa = isa or cpu_library.supported_isas()[-1]

    def _decode(self, query, key_cache, value_cache, meta, seqs: list[int], scale: float):
        if query.dtype not in DTYPES or key_cache.device.type != "cpu":
            return super()._decode(query, key_cache, value_cache, meta, seqs, scale)
        lib = cpu_library.load()
        assert lib is not None  # chosen only where cpu_library.available()
        if len(seqs) == meta.num_seqs:
            tables, seq_lens = meta.block_tables, meta.seq_lens
        else:
            index = torch.tensor(seqs)
            tables, seq_lens = meta.block_tables[index], meta.seq_lens[index]
        tables = tables.to(torch.int32).contiguous()
        seq_lens = seq_lens.to(torch.int32).contiguous()
        query = query.contiguous()
        out = torch.empty_like(query)
        _, num_heads, head_dim = query.shape
        status = lib.paged_decode(
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            tables.data_ptr(),
            seq_lens.data_ptr(),
            out.data_ptr(),
            len(seqs),
            num_heads,
            key_cache.shape[2],
            head_dim,
            key_cache.shape[1],
            tables.shape[1],
            scale,
            DTYPES[query.dtype],
            torch.get_num_threads(),
            cpu_library.ISAS[self.isa],
        )
        cpu_library.check(status, "paged_decode", self.isa)
        return out

    def _prefill_chunks(
        self, query, out, key_cache, value_cache, meta, seqs: list[int], starts, scale: float
    ) -> None:
        head_dim = query.shape[2]
        if query.dtype not in DTYPES or key_cache.device.type != "cpu" or head_dim % 16:
            super()._prefill_chunks(query, out, key_cache, value_cache, meta, seqs, starts, scale)
            return
        if not seqs:
            return
        lib = cpu_library.load()
        assert lib is not None  # chosen only where cpu_library.available()
        index = torch.tensor(seqs)
        tables = meta.block_tables[index].to(torch.int32).contiguous()
        seq_lens = meta.seq_lens[index].to(torch.int32).contiguous()
        query_starts = torch.tensor([starts[i] for i in seqs], dtype=torch.int32)
        query_lens = torch.tensor([meta.query_lens_host[i] for i in seqs], dtype=torch.int32)
        query = query.contiguous()
        assert out.is_contiguous()
        status = lib.paged_prefill(
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            tables.data_ptr(),
            seq_lens.data_ptr(),
            query_starts.data_ptr(),
            query_lens.data_ptr(),
            out.data_ptr(),
            len(seqs),
            query.shape[1],
            key_cache.shape[2],
            head_dim,
            key_cache.shape[1],
            tables.shape[1],
            scale,
            DTYPES[query.dtype],
            torch.get_num_threads(),
            cpu_library.ISAS[self.isa],
        )
        cpu_library.check(status, "paged_prefill", self.isa)
