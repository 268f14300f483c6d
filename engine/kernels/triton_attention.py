"""Triton kernels over the paged KV cache: storing new keys/values and flat-batch attention.

Caches are ``[num_blocks, block_size, num_kv_heads, head_dim]`` with a unit stride on the
last dimension, in the activations' dtype or e4m3 (``KV_FP8``: ``layers/attention/fp8_kv``).
Loads are upcast to fp32 and the arithmetic runs in fp32 (bf16/fp16 activations get fp32
accumulation, and the kernels stay correct under Triton's interpreter, whose bf16
arithmetic is broken), except the attention dots where a launch asks for native operands.
"""

import triton
import triton.language as tl

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def tanh(x):
    """``tanh(x)`` in fp32 as ``1 - 2 / (exp(2x) + 1)``: exact at both limits (``exp``
    overflowing to infinity gives 1), within about 1e-7 absolute near 0."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def round_to_fp8(x):
    """``x`` (fp32) clamped to ±448 and rounded to the nearest e4m3 value, ties to even, still
    in fp32, so that the cast to e4m3 after is exact: Triton's interpreter rounds that cast
    toward zero and loses the carry into the exponent (31.5 became 16). The step between
    e4m3 values at ``x`` is 2^(exponent - 3), and 2^-9 below 2^-6 (the subnormals); adding
    and taking off 1.5 * 2^23 rounds ``x / step`` (below 16) to an integer, ties to even."""
    magnitude = tl.minimum(tl.abs(x), FP8_MAX)
    exponent = tl.maximum(magnitude.to(tl.int32, bitcast=True) >> 23, 121)
    step = ((exponent - 3) << 23).to(tl.float32, bitcast=True)
    rounded = ((magnitude / step + 12582912.0) - 12582912.0) * step
    return tl.where(x < 0, -rounded, rounded)


@triton.jit
def store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    key_stride_token,
    key_stride_head,
    value_stride_token,
    value_stride_head,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    k_inv_scale,
    v_inv_scale,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program per token: copies its ``[num_kv_heads, head_dim]`` key and value rows
    to cache slot ``slot_mapping[token]``; with ``KV_FP8``, the key times ``k_inv_scale``
    and the value times ``v_inv_scale``, rounded to e4m3 (else the scales are unused). A
    negative slot (a padding token) is skipped."""
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HEAD_PAD)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    cache_offsets = (
        (slot // BLOCK_SIZE) * cache_stride_block
        + (slot % BLOCK_SIZE) * cache_stride_slot
        + heads * cache_stride_head
        + dims
    )
    row = token.to(tl.int64)
    key = tl.load(key_ptr + row * key_stride_token + heads * key_stride_head + dims, mask=mask)
    value = tl.load(
        value_ptr + row * value_stride_token + heads * value_stride_head + dims, mask=mask
    )
    if KV_FP8:
        key = round_to_fp8(key.to(tl.float32) * k_inv_scale).to(key_cache_ptr.dtype.element_ty)
        value = round_to_fp8(value.to(tl.float32) * v_inv_scale).to(
            value_cache_ptr.dtype.element_ty
        )
    tl.store(key_cache_ptr + cache_offsets, key, mask=mask)
    tl.store(value_cache_ptr + cache_offsets, value, mask=mask)


@triton.jit
def paged_attention_kernel(
    out_ptr,
    split_acc_ptr,
    split_max_ptr,
    split_sum_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale,
    v_scale,
    sinks_ptr,
    window,
    softcap,
    query_stride_token,
    query_stride_head,
    out_stride_token,
    out_stride_head,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_tables_stride,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NATIVE_DOTS: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr,
    KV_FP8: tl.constexpr,
    SLIDING: tl.constexpr,
    SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Program ``(seq, kv_head, q_tile * NUM_SPLITS + split)`` attends ``BLOCK_Q`` query
    tokens of sequence ``seq``, for all ``GROUP`` query heads sharing ``kv_head``, over
    split ``split`` of the keys the tile sees.

    The tile's rows are (token, head-in-group) pairs, ``BLOCK_M = BLOCK_Q * GROUP_PAD`` of
    them, so one K/V tile load serves the whole GQA group. Query row ``j`` of a sequence
    sits at position ``seq_len - query_len + j`` and sees keys at positions ``<=`` its own;
    the keys run up to the tile's last position. Softmax is online, in base 2.

    With ``NUM_SPLITS == 1`` the program writes the attention output. Otherwise the keys
    are cut into ``NUM_SPLITS`` ranges of whole key tiles (the last ones may be empty) and
    the program writes its range's unnormalised output, running max and sum for row
    ``(token * num_heads + head) * NUM_SPLITS + split`` of the ``split_*`` buffers, which
    ``merge_splits_kernel`` combines: many programs share one long context when a decode
    batch alone would leave most of the GPU idle.

    ``NATIVE_DOTS`` keeps the dots' operands in the cache's dtype (the probabilities are
    cast to it before ``p @ v``) with fp32 accumulation, as tensor cores take them;
    otherwise every operand is upcast to fp32 first. Offsets into the caches are 32-bit unless
    ``WIDE_OFFSETS`` (a cache of ``2**31`` elements or more): half the registers per
    address.

    ``KV_FP8``: the caches are e4m3, upcast to fp32 as they load (never native dots); the
    keys' scale comes folded into ``scale`` and the values' is ``v_scale``, applied to the
    output once (unused otherwise).

    The attention kinds (``AttentionBackend.attend``), each a compile-time switch whose
    runtime argument is unused when off: ``SLIDING``, a query at ``p`` sees keys
    ``p - window < j <= p``, and the keys start at the tile's earliest row's first one (the
    blocks before it are never read); ``SOFTCAP``, each score becomes
    ``softcap * tanh(score / softcap)``; ``SINKS``, head ``h``'s logit ``sinks_ptr[h]``
    (fp32) starts the running max and sum of split 0 as a key of zero value would.
    """
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    if q_tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    q_index = q_tile * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (q_index < query_len) & (rows % GROUP_PAD < GROUP)
    positions = context_len + q_index
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_DIM
    tokens = (query_start + q_index).to(tl.int64)

    q_mask = row_valid[:, None] & dim_valid[None, :]
    q_offsets = tokens[:, None] * query_stride_token + head[:, None] * query_stride_head
    q = tl.load(query_ptr + q_offsets + dims[None, :], mask=q_mask, other=0.0)
    if not NATIVE_DOTS:
        q = q.to(tl.float32)

    qk_scale = scale * LOG2E
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:
        sink = tl.load(sinks_ptr + head, mask=rows % GROUP_PAD < GROUP, other=-1.0e30) * LOG2E
        m_i = tl.where(split == 0, sink, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * block_tables_stride
    kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
    kv_first = 0
    if SLIDING:
        kv_first = tl.maximum(context_len + q_tile * BLOCK_Q - window + 1, 0)
    span = tl.cdiv(tl.cdiv(kv_end - kv_first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_start = kv_first + split * span
    kv_end = tl.minimum(kv_end, kv_start + span)
    for start in range(kv_start, kv_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_valid = cols < kv_end
        blocks = tl.load(block_table + cols // BLOCK_SIZE, mask=col_valid, other=0)
        if WIDE_OFFSETS:
            blocks = blocks.to(tl.int64)
        kv_offsets = (
            blocks * cache_stride_block
            + (cols % BLOCK_SIZE) * cache_stride_slot
            + kv_head * cache_stride_head
        )
        k = tl.load(
            key_cache_ptr + kv_offsets[None, :] + dims[:, None],
            mask=dim_valid[:, None] & col_valid[None, :],
            other=0.0,
        )
        if not NATIVE_DOTS:
            k = k.to(tl.float32)
        if SOFTCAP:
            scores = tl.dot(q, k, input_precision=DOT_PRECISION) * (scale / softcap)
            scores = tanh(scores) * (softcap * LOG2E)
        else:
            scores = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        visible = (cols[None, :] <= positions[:, None]) & col_valid[None, :]
        if SLIDING:
            visible &= cols[None, :] > positions[:, None] - window
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            value_cache_ptr + kv_offsets[:, None] + dims[None, :],
            mask=col_valid[:, None] & dim_valid[None, :],
            other=0.0,
        )
        if NATIVE_DOTS:
            p = p.to(v.dtype)
        else:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    if NUM_SPLITS == 1:
        acc = acc / tl.where(row_valid, l_i, 1.0)[:, None]
        out_offsets = tokens[:, None] * out_stride_token + head[:, None] * out_stride_head
        tl.store(
            out_ptr + out_offsets + dims[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )
    else:
        num_heads = tl.num_programs(1) * GROUP
        split_rows = (tokens * num_heads + head) * NUM_SPLITS + split
        tl.store(split_max_ptr + split_rows, m_i, mask=row_valid)
        tl.store(split_sum_ptr + split_rows, l_i, mask=row_valid)
        tl.store(split_acc_ptr + split_rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)


@triton.jit
def merge_splits_kernel(
    out_ptr,
    split_acc_ptr,
    split_max_ptr,
    split_sum_ptr,
    out_stride_token,
    out_stride_head,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """Program ``(token, head)`` combines the ``NUM_SPLITS`` partial results that
    ``paged_attention_kernel`` wrote for one query row: each split's output and sum are
    rescaled from its own running max to the largest (an empty split has max -1e30 and
    sum 0, so it weighs nothing), summed, and normalised once."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    first = (token * tl.num_programs(1) + head) * NUM_SPLITS
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_DIM
    maxes = tl.load(split_max_ptr + first + splits)
    weights = tl.exp2(maxes - tl.max(maxes, 0))
    total = tl.sum(tl.load(split_sum_ptr + first + splits) * weights, 0)
    acc = tl.load(
        split_acc_ptr + (first + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=dim_valid[None, :],
        other=0.0,
    )
    out = tl.sum(acc * weights[:, None], 0) / total
    tl.store(
        out_ptr + token * out_stride_token + head * out_stride_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_valid,
    )
