"""Paged attention in plain torch: the CPU path and the reference for the GPU kernels."""

from itertools import accumulate

import torch
import torch.nn.functional as F

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.fp8_kv import (
    FP8,
    UNIT_SCALES,
    KVScales,
    dequantize,
    is_fp8,
    quantize,
)
from kvserve.engine.layers.attention.metadata import AttentionMetadata


def gather_context(
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    length: int,
    dtype: torch.dtype,
    scale: float = 1.0,
) -> torch.Tensor:
    """Rows of ``block_tables`` ``[B, nb]`` → their first ``length`` cached tokens
    ``[B, num_kv_heads, length, head_dim]`` in ``dtype`` (an e4m3 cache's read back as
    ``stored * scale``)."""
    num_blocks = cdiv(length, cache.shape[1])
    index = block_tables[:, :num_blocks].long()
    if is_fp8(cache):  # gathered as bytes: torch's CPU indexing takes no e4m3
        blocks = dequantize(cache.view(torch.uint8)[index].view(FP8), scale, dtype)
    else:
        blocks = cache[index]  # [B, nb, block_size, kvh, d]
    return blocks.flatten(1, 2)[:, :length].transpose(1, 2)


class TorchAttention(AttentionBackend):
    """Decode tokens (query length 1) of all sequences go through one batched,
    length-masked SDPA call; prefill chunks go one sequence at a time."""

    name = "torch"

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping, kv_scales=UNIT_SCALES):
        """A negative slot (a padding row of a static batch) writes nothing, as in the
        Triton kernel: ``index_copy_`` would treat it as an index from the end."""
        num_kv_heads, head_dim = key.shape[1:]
        if bool((slot_mapping < 0).any()):
            kept = slot_mapping >= 0
            key, value, slot_mapping = key[kept], value[kept], slot_mapping[kept]
        if is_fp8(key_cache):  # copied as bytes: torch's CPU index_copy_ takes no e4m3
            key = quantize(key, kv_scales.k).view(torch.uint8)
            value = quantize(value, kv_scales.v).view(torch.uint8)
            key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)

    def attend(
        self, query, key_cache, value_cache, meta: AttentionMetadata, scale, kv_scales=UNIT_SCALES
    ):
        decodes = [i for i, q in enumerate(meta.query_lens_host) if q == 1]
        if len(decodes) == meta.num_seqs:
            return self._decode(query, key_cache, value_cache, meta, decodes, scale, kv_scales)
        out = torch.empty_like(query)
        starts = [0, *accumulate(meta.query_lens_host)]
        if decodes:
            rows = torch.tensor([starts[i] for i in decodes], device=query.device)
            decoded = self._decode(
                query[rows], key_cache, value_cache, meta, decodes, scale, kv_scales
            )
            out.index_copy_(0, rows, decoded)
        chunks = [i for i, q_len in enumerate(meta.query_lens_host) if q_len > 1]
        self._prefill_chunks(
            query, out, key_cache, value_cache, meta, chunks, starts, scale, kv_scales
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
    ) -> None:
        """Write the attention of sequences ``seqs`` (chunks longer than one token, rows
        ``starts[i]:starts[i + 1]`` of ``query``) into the same rows of ``out``."""
        for i in seqs:
            span = slice(starts[i], starts[i + 1])
            out[span] = self._prefill(
                query[span], key_cache, value_cache, meta, i, scale, kv_scales
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
    ):
        index = torch.tensor(seqs)
        seq_lens = meta.seq_lens[index].to(torch.long)
        length = max(meta.seq_lens_host[i] for i in seqs)
        tables = meta.block_tables[index]
        key = gather_context(key_cache, tables, length, query.dtype, kv_scales.k)
        value = gather_context(value_cache, tables, length, query.dtype, kv_scales.v)
        mask = torch.arange(length, device=query.device)[None, :] < seq_lens[:, None]
        out = F.scaled_dot_product_attention(
            query.unsqueeze(2),  # [B, H, 1, d]
            key,
            value,
            attn_mask=mask[:, None, None, :],
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(2)

    @staticmethod
    def _prefill(query, key_cache, value_cache, meta, seq: int, scale: float, kv_scales: KVScales):
        q_len, seq_len = meta.query_lens_host[seq], meta.seq_lens_host[seq]
        tables = meta.block_tables[seq : seq + 1]
        key = gather_context(key_cache, tables, seq_len, query.dtype, kv_scales.k)
        value = gather_context(value_cache, tables, seq_len, query.dtype, kv_scales.v)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, H, q_len, d]
        if q_len == seq_len:
            out = F.scaled_dot_product_attention(
                q, key, value, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            positions = torch.arange(seq_len - q_len, seq_len, device=query.device)
            mask = torch.arange(seq_len, device=query.device)[None, :] <= positions[:, None]
            out = F.scaled_dot_product_attention(
                q, key, value, attn_mask=mask, scale=scale, enable_gqa=True
            )
        return out[0].transpose(0, 1)
