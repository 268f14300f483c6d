"""Paged batches with freed window blocks, and the dense float64 attention they are checked
against, for the attention kinds' tests (windows, sinks, soft-capping)."""

import math
from dataclasses import dataclass

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers.attention.fp8_kv import FP8, UNIT_SCALES, KVScales, quantize
from kvserve.engine.layers.attention.metadata import AttentionMetadata

POISON = 1e4  # what the padding entries of the block tables point at
CPU = torch.device("cpu")


@dataclass
class KindBatch:
    """A flat step batch whose keys and values are all in the paged cache already, with
    ``keys[i]``/``values[i]`` ``[seq_lens[i], kv heads, head_dim]`` (float32, the values the
    cache stands for) beside it. Blocks that only hold positions before the window of a
    sequence's earliest query row point at a block of NaNs, as a freed block might; table
    padding points at a block of ``POISON``."""

    meta: AttentionMetadata
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def make_kind_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    window: int | None,
    kv_fp8: bool = False,
    kv_scales: KVScales = UNIT_SCALES,
    device: torch.device = CPU,
) -> KindBatch:
    """Blocks come in random order from a pool with spares; an e4m3 cache (``kv_fp8``) holds
    ``x / scale`` rounded, and ``keys``/``values`` what it reads back as."""
    needed = [cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(needed) + 4
    free = torch.randperm(num_blocks - 2).tolist()
    padding, freed = num_blocks - 2, num_blocks - 1
    tables = torch.full((len(seq_lens), max(needed) + 1), padding, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.randn(shape), torch.randn(shape)]  # stale values in unused slots
    for cache in caches:
        cache[padding], cache[freed] = POISON, math.nan
    contents: list[list[torch.Tensor]] = [[], []]
    for i, (q_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        first = 0 if window is None else max(0, seq_len - q_len - window + 1) // block_size
        tables[i, :first] = freed
        tables[i, first : needed[i]] = torch.tensor([free.pop() for _ in range(needed[i] - first)])
        kept = torch.arange(first * block_size, seq_len)
        slots = tables[i, kept // block_size].long() * block_size + kept % block_size
        for cache, scale, content in zip(caches, kv_scales, contents, strict=True):
            x = torch.randn(seq_len, num_kv_heads, head_dim).to(dtype).float()
            if kv_fp8:
                x = quantize(x, scale).float() * scale
            cache.view(-1, num_kv_heads, head_dim)[slots] = x[kept]
            content.append(x)
    if kv_fp8:
        caches = [quantize(c, s) for c, s in zip(caches, kv_scales, strict=True)]
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    key_cache, value_cache = (c.to(device, FP8 if kv_fp8 else dtype) for c in caches)
    return KindBatch(
        meta=meta,
        query=torch.randn(starts[-1], num_heads, head_dim).to(device, dtype),
        key_cache=key_cache,
        value_cache=value_cache,
        keys=contents[0],
        values=contents[1],
    )


def dense_reference(
    batch: KindBatch,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Each sequence's attention in float64 from its unpaged keys and values, the query at
    position ``p`` seeing positions ``p - window < j <= p``; ``[num_tokens, heads, dim]``."""
    out = []
    start = 0
    for q_len, seq_len, keys, values in zip(
        batch.meta.query_lens_host,
        batch.meta.seq_lens_host,
        batch.keys,
        batch.values,
        strict=True,
    ):
        q = batch.query[start : start + q_len].cpu().double()
        start += q_len
        positions = torch.arange(seq_len - q_len, seq_len)[:, None]
        first = 0 if window is None else max(0, seq_len - q_len - window + 1)
        j = torch.arange(first, seq_len)[None, :]
        group = q.shape[1] // keys.shape[1]
        k = keys[first:].double().repeat_interleave(group, dim=1)
        v = values[first:].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        visible = j <= positions
        if window is not None:
            visible &= j > positions - window
        scores = scores.masked_fill(~visible, -math.inf)
        if sinks is not None:
            sink = sinks.cpu().double()[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(out)
