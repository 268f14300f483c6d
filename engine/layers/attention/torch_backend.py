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
from kvserve.engine.layers.attention.kind import AttentionKind
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
    length-masked SDPA call; prefill chunks go one sequence at a time. A window masks more
    and gathers only the blocks it sees; sinks or soft-capping take ``dense_attention``
    (fp32 scores) instead of SDPA."""

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
        if not key_cache.is_contiguous():  # a layer's slice of pages of several layers
            block_size = key_cache.shape[1]
            blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
            key_cache[blocks, offsets] = key
            value_cache[blocks, offsets] = value
            return
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)

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
        kind = AttentionKind(window, sinks, softcap)
        decodes = [i for i, q in enumerate(meta.query_lens_host) if q == 1]
        if len(decodes) == meta.num_seqs:
            return self._decode(
                query, key_cache, value_cache, meta, decodes, scale, kv_scales, kind
            )
        out = torch.empty_like(query)
        starts = [0, *accumulate(meta.query_lens_host)]
        if decodes:
            rows = torch.tensor([starts[i] for i in decodes], device=query.device)
            decoded = self._decode(
                query[rows], key_cache, value_cache, meta, decodes, scale, kv_scales, kind
            )
            out.index_copy_(0, rows, decoded)
        chunks = [i for i, q_len in enumerate(meta.query_lens_host) if q_len > 1]
        self._prefill_chunks(
            query, out, key_cache, value_cache, meta, chunks, starts, scale, kv_scales, kind
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
        """Write the attention of sequences ``seqs`` (chunks longer than one token, rows
        ``starts[i]:starts[i + 1]`` of ``query``) into the same rows of ``out``."""
        for i in seqs:
            span = slice(starts[i], starts[i + 1])
            out[span] = self._prefill(
                query[span], key_cache, value_cache, meta, i, scale, kv_scales, kind
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
        index = torch.tensor(seqs)
        seq_lens = meta.seq_lens[index].to(torch.long)
        tables = meta.block_tables[index]
        lens = [meta.seq_lens_host[i] for i in seqs]
        if kind.window is None:
            length = max(lens)
            keys = torch.arange(length, device=query.device)[None, :]
            mask = keys < seq_lens[:, None]
        else:
            tables, first = _window_tables(tables, lens, kind, key_cache.shape[1])
            length = max(n - f for n, f in zip(lens, first, strict=True))
            keys = torch.tensor(first, device=query.device)[:, None] + torch.arange(
                length, device=query.device
            )
            mask = (keys < seq_lens[:, None]) & (keys >= seq_lens[:, None] - kind.window)
        key = gather_context(key_cache, tables, length, query.dtype, kv_scales.k)
        value = gather_context(value_cache, tables, length, query.dtype, kv_scales.v)
        out = _attention(query.unsqueeze(2), key, value, mask[:, None, None, :], scale, kind)
        return out.squeeze(2)

    @staticmethod
    def _prefill(
        query,
        key_cache,
        value_cache,
        meta,
        seq: int,
        scale: float,
        kv_scales: KVScales,
        kind: AttentionKind,
    ):
        q_len, seq_len = meta.query_lens_host[seq], meta.seq_lens_host[seq]
        block_size = key_cache.shape[1]
        first = kind.first_key(seq_len - q_len) // block_size * block_size
        tables = meta.block_tables[seq : seq + 1, first // block_size :]
        key = gather_context(key_cache, tables, seq_len - first, query.dtype, kv_scales.k)
        value = gather_context(value_cache, tables, seq_len - first, query.dtype, kv_scales.v)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, H, q_len, d]
        if q_len == seq_len and kind.plain:
            out = F.scaled_dot_product_attention(
                q, key, value, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            positions = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
            keys = torch.arange(first, seq_len, device=query.device)[None, :]
            mask = keys <= positions
            if kind.window is not None:
                mask &= keys > positions - kind.window
            out = _attention(q, key, value, mask, scale, kind)
        return out[0].transpose(0, 1)


def _window_tables(
    tables: torch.Tensor, lens: list[int], kind: AttentionKind, block_size: int
) -> tuple[torch.Tensor, list[int]]:
    """Rows of ``tables`` of decode sequences ``lens`` long, each shifted to start at the
    block holding its first visible key, and those keys' positions. Columns past a
    sequence's last block repeat that block (masked out): a row reads none of its freed
    blocks nor its padding."""
    first_blocks = [kind.first_key(n - 1) // block_size for n in lens]
    last_blocks = [cdiv(n, block_size) - 1 for n in lens]
    width = max(last - first for first, last in zip(first_blocks, last_blocks, strict=True)) + 1
    columns = torch.tensor(first_blocks)[:, None] + torch.arange(width)
    columns = torch.minimum(columns, torch.tensor(last_blocks)[:, None])
    return tables.gather(1, columns.to(tables.device)), [b * block_size for b in first_blocks]


def _attention(q, key, value, mask, scale: float, kind: AttentionKind) -> torch.Tensor:
    """SDPA of ``q`` ``[B, H, q, d]`` over ``key``/``value`` ``[B, kv heads, L, d]`` where
    ``mask`` (broadcast to ``[B, H, q, L]``) is true; ``dense_attention`` for sinks or
    soft-capping, which SDPA has not."""
    if kind.sinks is None and kind.softcap is None:
        return F.scaled_dot_product_attention(
            q, key, value, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return dense_attention(q, key, value, mask, scale, kind.sinks, kind.softcap)


def dense_attention(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention as ``AttentionBackend.attend`` defines it, written out in fp32: ``q``
    ``[B, H, q, d]``, ``key``/``value`` ``[B, kv heads, L, d]`` (query head ``h`` reads kv
    head ``h // (H / kv heads)``), ``mask`` true where a query sees a key; a row must see
    at least one key. Returns ``[B, H, q, d]`` in ``q``'s dtype."""
    group = q.shape[1] // key.shape[1]
    key = key.float().repeat_interleave(group, dim=1)
    value = value.float().repeat_interleave(group, dim=1)
    scores = q.float() @ key.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = scores.softmax(-1)
    else:
        sink = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return (probs @ value).to(q.dtype)
