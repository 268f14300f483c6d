"""Sliding windows, attention sinks and logit soft-capping in every attention backend,
against a dense float64 reference over the unpaged keys and values.

Blocks wholly before the window of a sequence's earliest query row hold NaN (a freed block
may hold anything): a backend that reads one returns NaN. A failing case prints its seed;
``KVSERVE_TEST_SEED=<seed>`` replays it.
"""

import os
import secrets

import pytest
import torch
from attention_kinds_reference import KindBatch, dense_reference, make_kind_batch
from test_triton_attention import CPU_PATHS

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.fp8_kv import UNIT_SCALES, KVScales
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.attention.triton_backend import TritonAttention

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
BACKENDS = [
    pytest.param(TorchAttention, id="torch"),
    pytest.param(TritonAttention, id="triton"),
    *CPU_PATHS,
]
# (window, sinks, softcap): plain, each alone, gpt-oss's (window and sinks), Gemma 2's
# (window and soft-cap), all three.
KINDS = [
    pytest.param(None, False, None, id="plain"),
    pytest.param(13, False, None, id="window"),
    pytest.param(None, True, None, id="sinks"),
    pytest.param(None, False, 1.5, id="softcap"),
    pytest.param(13, True, None, id="window-sinks"),
    pytest.param(13, False, 1.5, id="window-softcap"),
    pytest.param(13, True, 1.5, id="all"),
]
SCALE = 0.2  # not head_dim**-0.5: Gemma's query_pre_attn_scalar


@pytest.fixture
def seed() -> int:
    seed = int(os.environ.get("KVSERVE_TEST_SEED", secrets.randbits(32)))
    print(f"seed {seed}: replay with KVSERVE_TEST_SEED={seed}")
    torch.manual_seed(seed)
    return seed


def check(
    backend: AttentionBackend,
    batch: KindBatch,
    seed: int,
    window: int | None,
    with_sinks: bool,
    softcap: float | None,
    kv_scales: KVScales = UNIT_SCALES,
) -> None:
    """``backend``'s attention over ``batch`` is the dense reference's, to the dtype's
    tolerance relative to the largest output."""
    num_heads = batch.query.shape[1]
    sinks = torch.randn(num_heads, device=batch.query.device) * 2 if with_sinks else None
    out = backend.attend(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.meta,
        SCALE,
        kv_scales,
        window=window,
        sinks=sinks,
        softcap=softcap,
    )
    reference = dense_reference(batch, SCALE, window, sinks, softcap)
    assert out.dtype == batch.query.dtype and out.shape == batch.query.shape
    error = ((out.cpu().double() - reference).abs().max() / reference.abs().max()).item()
    limit = TOLERANCE[batch.query.dtype]
    assert error <= limit, f"relative error {error:.3g} > {limit} (seed {seed})"


# Block size 8, window 13: decodes whose windows start mid-block (and one shorter than its
# window), whole prompts, chunks after a cached prefix whose earliest row's window frees
# blocks, a 6-token prompt inside one block.
MIXED_QUERY_LENS = [1, 37, 9, 1, 1, 20, 6]
MIXED_SEQ_LENS = [45, 37, 30, 16, 3, 70, 6]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window, sinks, softcap", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 4])
def test_mixed_batch_matches_the_dense_reference(seed, gqa, dtype, window, sinks, softcap, backend):
    batch = make_kind_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=4,
        num_kv_heads=4 // gqa,
        head_dim=64,
        dtype=dtype,
        block_size=8,
        window=window,
    )
    check(backend(), batch, seed, window, sinks, softcap)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window, sinks, softcap", KINDS)
@pytest.mark.parametrize("window_size", [8, 13, 70, 150])
def test_decode_batch_matches_the_dense_reference(
    seed, window_size, window, sinks, softcap, backend
):
    """Every sequence decodes (the batched path): contexts from 1 token to many windows,
    a window of exactly one block, one that crosses two block boundaries, one that Triton
    splits into two key ranges, one that the C kernel splits into two (sinks join one
    range only)."""
    window = window and window_size
    batch = make_kind_batch(
        [1] * 7,
        [1, 8, 9, 21, 40, 200, 400],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        block_size=8,
        window=window,
    )
    check(backend(), batch, seed, window, sinks, softcap)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window, sinks, softcap", KINDS)
def test_grouped_bf16_decode_matches_the_dense_reference(seed, window, sinks, softcap, backend):
    """Six query heads on a kv head: the C kernel's bf16 dot products where it has them."""
    batch = make_kind_batch(
        [1] * 4,
        [5, 30, 77, 160],
        num_heads=12,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.bfloat16,
        block_size=16,
        window=window,
    )
    check(backend(), batch, seed, window, sinks, softcap)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window, sinks, softcap", KINDS[1:3] + KINDS[-1:])
def test_fp8_cache_matches_the_dense_reference(seed, window, sinks, softcap, backend):
    scales = KVScales(0.05, 0.03)
    batch = make_kind_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        block_size=8,
        window=window,
        kv_fp8=True,
        kv_scales=scales,
    )
    check(backend(), batch, seed, window, sinks, softcap, scales)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_of_one_token_returns_each_rows_own_value(seed, backend):
    batch = make_kind_batch(
        [1, 5, 12],
        [9, 5, 30],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        dtype=torch.float32,
        block_size=4,
        window=1,
    )
    out = backend().attend(
        batch.query, batch.key_cache, batch.value_cache, batch.meta, SCALE, window=1
    )
    own = torch.cat(
        [v[s - q :] for q, s, v in zip([1, 5, 12], [9, 5, 30], batch.values, strict=True)]
    )
    torch.testing.assert_close(out.cpu(), own.expand(-1, 2, -1))
