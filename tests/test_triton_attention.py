"""The Triton kernels against the torch path, on fresh random inputs each run.

On a machine without CUDA the kernels run in Triton's interpreter (tests/conftest.py turns
it on before anything imports them); on a CUDA machine the same tests run them compiled.
A failing case prints its seed; ``KVSERVE_TEST_SEED=<seed>`` replays it.
"""

import dataclasses
import functools
import itertools
import os
import secrets
from dataclasses import dataclass

import pytest
import torch
from cpu_paths import ISA_PARAMS, num_threads
from joined_outputs import JoinedOutputs

from kvserve import SamplingParams
from kvserve.engine.cdiv import cdiv
from kvserve.engine.config import EngineConfig
from kvserve.engine.kernels import cpu_library
from kvserve.engine.layers.attention import triton_backend
from kvserve.engine.layers.attention.backend import select_backend
from kvserve.engine.layers.attention.cpu_backend import CPUAttention
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.attention.triton_backend import (
    TritonAttention,
    attention_launch,
    paged_attention,
)
from kvserve.engine.layers.cpu_linear import dpbf16_linear
from kvserve.engine.llm_engine import LLMEngine

from reference import assert_greedy_match, hf_greedy

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
POISON = 1e4  # what the padding entries of the block tables point at
# The CPU decode kernel on each of its SIMD paths; the ones this CPU cannot run are skipped.
CPU_PATHS = [
    pytest.param(functools.partial(CPUAttention, p.values[0]), id=f"cpu-{p.id}", marks=p.marks)
    for p in ISA_PARAMS
] + [
    pytest.param(
        functools.partial(CPUAttention, "avx512", bf16_dots=True),
        id="cpu-avx512-bf16-dots",
        marks=pytest.mark.skipif(
            "avx512" not in cpu_library.supported_isas()
            or not dpbf16_linear.can_use(torch.bfloat16, torch.device("cpu")),
            reason="this CPU has no AVX-512-BF16",
        ),
    )
]
BACKENDS = [pytest.param(TritonAttention, id="triton"), *CPU_PATHS]


def device_of(backend: type) -> torch.device:
    """Where a backend's test batch lives: the CPU kernel's on the CPU, also where CUDA is."""
    return DEVICE if backend is TritonAttention else torch.device("cpu")


@pytest.fixture
def seed() -> int:
    seed = int(os.environ.get("KVSERVE_TEST_SEED", secrets.randbits(32)))
    print(f"seed {seed}: replay with KVSERVE_TEST_SEED={seed}")
    torch.manual_seed(seed)
    return seed


@dataclass
class Batch:
    """A flat step batch over a random paged cache whose new tokens are not stored yet."""

    meta: AttentionMetadata
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int = 16,
    shared: dict[int, tuple[int, int]] | None = None,
    device: torch.device = DEVICE,
) -> Batch:
    """Blocks are drawn in random order from a pool with spares, so block tables are not
    contiguous; ``shared[i] = (j, n)`` gives sequence ``i`` the first ``n`` blocks of
    sequence ``j`` (both must hold them in their cached prefix, as prefix caching does).
    Table padding points at a block of huge values that no sequence owns."""
    shared = shared or {}
    blocks_needed = [cdiv(s, block_size) for s in seq_lens]
    max_blocks = max(blocks_needed) + 1
    num_blocks = sum(blocks_needed) + 4
    free = torch.randperm(num_blocks - 1).tolist()
    poison_block = num_blocks - 1
    tables = torch.full((len(seq_lens), max_blocks), poison_block, dtype=torch.int32)
    for i, needed in enumerate(blocks_needed):
        donor, num_shared = shared.get(i, (i, 0))
        for j in (i, donor):
            assert num_shared * block_size <= seq_lens[j] - query_lens[j], "shared block written"
        tables[i, :num_shared] = tables[donor, :num_shared]
        for b in range(num_shared, needed):
            tables[i, b] = free.pop()
    slots = [
        int(tables[i, p // block_size]) * block_size + p % block_size
        for i, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True))
        for p in range(s - q, s)
    ]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache, value_cache = (torch.randn(cache_shape).to(device, dtype) for _ in range(2))
    key_cache[poison_block] = POISON
    value_cache[poison_block] = POISON
    num_tokens = starts[-1]
    return Batch(
        meta=meta,
        query=torch.randn(num_tokens, num_heads, head_dim).to(device, dtype),
        key=torch.randn(num_tokens, num_kv_heads, head_dim).to(device, dtype),
        value=torch.randn(num_tokens, num_kv_heads, head_dim).to(device, dtype),
        key_cache=key_cache,
        value_cache=value_cache,
    )


def check_attention(
    batch: Batch, seed: int, backend: type = TritonAttention, limit: float | None = None
) -> None:
    """Stores the new tokens through the torch path, then compares ``backend``'s attention
    (Triton's, or the CPU decode kernel's) with the torch path run in fp32 on the same
    (upcast) values, to ``limit`` (default: the dtype's ``TOLERANCE``)."""
    TorchAttention().store_kv(
        batch.key, batch.value, batch.key_cache, batch.value_cache, batch.meta.slot_mapping
    )
    scale = batch.query.shape[-1] ** -0.5
    out = backend().attend(batch.query, batch.key_cache, batch.value_cache, batch.meta, scale)
    reference = TorchAttention().attend(
        batch.query.float(), batch.key_cache.float(), batch.value_cache.float(), batch.meta, scale
    )
    assert out.dtype == batch.query.dtype
    assert out.shape == batch.query.shape
    error = ((out.float() - reference).abs().max() / reference.abs().max()).item()
    limit = TOLERANCE[batch.query.dtype] if limit is None else limit
    assert error <= limit, f"relative error {error:.3g} > {limit} (seed {seed})"


# Ragged mixed batch, block size 16: decodes ending mid-block and at a block end, a whole
# prompt from scratch spanning several query and key tiles, a chunk after a cached prefix,
# and a decode and a chunk that share prefix blocks with other sequences.
MIXED_QUERY_LENS = [1, 70, 19, 1, 1, 9]
MIXED_SEQ_LENS = [37, 70, 75, 16, 50, 41]
MIXED_SHARED = {4: (2, 2), 5: (4, 1)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 2, 4])
def test_mixed_batch_matches_torch(seed, gqa, head_dim, dtype, backend):
    batch = make_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=4,
        num_kv_heads=4 // gqa,
        head_dim=head_dim,
        dtype=dtype,
        shared=MIXED_SHARED,
        device=device_of(backend),
    )
    check_attention(batch, seed, backend)


@pytest.mark.parametrize("gqa", [1, 4])
def test_mixed_batch_fp16_matches_torch(seed, gqa):
    batch = make_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=8,
        num_kv_heads=8 // gqa,
        head_dim=64,
        dtype=torch.float16,
        shared=MIXED_SHARED,
    )
    check_attention(batch, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 2, 4])
def test_decode_batch_matches_torch(seed, gqa, dtype, backend):
    """The CUDA-graph shape: every sequence decodes; contexts from 1 token to several key
    tiles, three sequences reading the same first blocks."""
    batch = make_batch(
        [1] * 6,
        [1, 17, 130, 64, 95, 200],
        num_heads=8,
        num_kv_heads=8 // gqa,
        head_dim=64,
        dtype=dtype,
        shared={3: (2, 3), 4: (2, 5), 5: (2, 8)},
        device=device_of(backend),
    )
    check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim", [(5, 1, 64), (14, 2, 80), (16, 2, 128), (12, 3, 32)]
)
def test_cpu_decode_of_large_groups_matches_torch(
    seed, num_heads, num_kv_heads, head_dim, dtype, backend
):
    """Groups of 4 to 8 query heads on a kv head; from 5 on, bf16 decode tokens take the
    AVX-512-BF16 dot products (cpu_decode_isa.h, decode_dots) where the backend has them:
    contexts of 1 token to past two 48-key panels, odd ones leaving their last pair of
    values half empty; head_dim 80 packs 40 pairs of dims, not a multiple of 16."""
    batch = make_batch(
        [1] * 6,
        [1, 17, 47, 50, 97, 130],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        shared={3: (2, 2)},
        device=device_of(backend),
    )
    check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 4), (10, 2)])
def test_cpu_decode_reads_the_queries_in_place_in_the_qkv_rows(
    seed, num_heads, num_kv_heads, dtype, backend
):
    """Queries as the fused qkv projection leaves them (each row's q, k and v side by side,
    so rows are strided): the same output as from a contiguous copy, bit for bit (groups of
    2, and of 5, which bf16's dot products take)."""
    batch = make_batch(
        [1] * 5,
        [1, 17, 130, 64, 200],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=64,
        dtype=dtype,
        device=device_of(backend),
    )
    tokens, heads, head_dim = batch.query.shape
    qkv = torch.randn(tokens, (heads + 2 * num_kv_heads) * head_dim).to(dtype)
    qkv[:, : heads * head_dim] = batch.query.flatten(1)
    strided = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    assert not strided.is_contiguous()
    check_attention(batch, seed, backend)  # stores the keys and values, checks the copy

    scale = head_dim**-0.5
    out = backend().attend(strided, batch.key_cache, batch.value_cache, batch.meta, scale)
    copy = backend().attend(batch.query, batch.key_cache, batch.value_cache, batch.meta, scale)
    assert torch.equal(out, copy)


@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 2, 6])
def test_cpu_decode_splits_the_contexts_of_few_sequences_across_threads(seed, gqa, dtype, backend):
    """With few tokens per thread each context longer than 128 tokens is split into equal
    ranges whose partial softmax sums are merged: on 1-4 threads the 1,000-token context
    takes 3, 6 or 8 ranges, the 300-token one 1-3, the 129-token one 1-2, and 17 tokens stay
    whole; every thread count gives the torch path's result."""
    batch = make_batch(
        [1] * 4,
        [300, 17, 129, 1000],
        num_heads=6,
        num_kv_heads=6 // gqa,
        head_dim=64,
        dtype=dtype,
        device=device_of(backend),
    )
    for n in (1, 2, 3, 4):
        with num_threads(n):
            check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
def test_cpu_decode_caps_the_ranges_of_one_context(seed, backend):
    """On 32 threads a 9,000-token context would split into 71 ranges of 128 tokens; it
    takes 64 (the most the merge holds), of ~141 tokens each."""
    batch = make_batch(
        [1],
        [9000],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        dtype=torch.float32,
        device=device_of(backend),
    )
    with num_threads(32):
        check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("group", [1, 3])
def test_cpu_prefill_items_of_every_lane_count_match_torch(seed, group, dtype, backend):
    """A chunk's rows (query token, head of the group) go to items of one register panel
    each (48 rows in 3 vectors on AVX-512, 16 in 2 on AVX2, 8 in 2 on the baseline), its
    rows modulo the panel to a first item of 1..3 vectors: chunks of 1 to 97 rows, after
    contexts that end before, on and after a 256-key tile's end (0 to 767 keys); odd and
    even key counts in every tile (bf16 dot products read keys in pairs)."""
    query_lens = [1, 5, 11, 13, 20, 29, 40, 45, 48, 53, 97]
    contexts = [767, 0, 250, 3, 256, 511, 60, 255, 100, 512, 7]
    batch = make_batch(
        query_lens,
        [q + c for q, c in zip(query_lens, contexts, strict=True)],
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=32,
        dtype=dtype,
        device=device_of(backend),
    )
    check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_prefill_of_long_chunks_on_several_threads_matches_torch(seed, dtype, backend):
    """Chunks of several work items (48, 16 or 8 rows by path) and two key tiles (256 keys),
    one after a cached prefix that shares its first blocks with a decoding sequence, a whole
    prompt ending mid-tile, next to decodes; GQA 2; 2 and 3 threads share the work items."""
    batch = make_batch(
        [1, 150, 77, 1, 33],
        [90, 150, 300, 5, 33],
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        dtype=dtype,
        shared={2: (0, 5)},
        device=device_of(backend),
    )
    for n in (2, 3):
        with num_threads(n):
            check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", CPU_PATHS)
def test_cpu_prefill_with_scores_rising_by_hundreds_matches_torch(seed, backend):
    """Scores that grow with the key's position (by 0.5 a token, from -75 to 75 over the
    prompt): every key tile raises each row's max, so its sum and accumulator are rescaled
    again and again, and the first keys are far below e^-80 of the last (the kernel's exp
    floor). float32 resolves a score near 75 to 75 * 2^-24 (4.5e-6), and the kernel adds
    each of the head's 64 products to the ramp at that magnitude, so its scores, and with
    them the weights e^score, differ from torch's by up to ~1.3e-5 relative (200 seeds,
    every path; 2 % of seeds were over fp32's 1e-5): the limit is 3e-5. A kernel that skips
    the accumulator's rescale is off by 1.7."""
    batch = make_batch(
        [1, 300, 60],
        [300, 300, 200],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        device=device_of(backend),
    )
    block_size = batch.key_cache.shape[1]
    batch.query[..., 0] = 8.0  # times key[..., 0] times scale 1/8: the key's value of it
    lengths = zip(batch.meta.query_lens_host, batch.meta.seq_lens_host, strict=True)
    for i, (q_len, s_len) in enumerate(lengths):
        first_new = int(batch.meta.query_start_loc[i])
        for position in range(s_len):
            ramp = 0.5 * position - 75.0
            if position < s_len - q_len:
                block = int(batch.meta.block_tables[i, position // block_size])
                batch.key_cache[block, position % block_size, :, 0] = ramp
            else:
                batch.key[first_new + position - (s_len - q_len), :, 0] = ramp
    check_attention(batch, seed, backend, limit=3e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(6, 2, 48, 5), (7, 1, 32, 1), (2, 2, 16, 32), (3, 3, 80, 16), (4, 2, 8, 16)],
)
def test_uncommon_shapes_match_torch(
    seed, num_heads, num_kv_heads, head_dim, block_size, dtype, backend
):
    """GQA groups and head sizes that are not powers of two (80: one 64-dim pass of the CPU
    prefill kernel's outputs and a 16-dim tail; 48 and 80 leave the decode kernel's
    AVX-512 path one vector past its pairs), tiny head sizes, and block sizes other than
    16 go through the same masks; 8, not a multiple of 16, takes the torch path on the CPU."""
    batch = make_batch(
        [1, 23, 5],
        [40, 23, 71],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        block_size=block_size,
        shared={2: (0, 30 // block_size)},
        device=device_of(backend),
    )
    check_attention(batch, seed, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_tokens", [20, 100], ids=["20-tokens", "100-tokens"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_store_kv_is_exact(seed, dtype, num_tokens, backend):
    """Keys and values are views into one fused projection (strided rows); a negative slot
    is a padding token and writes nothing. 100 tokens: the CPU kernel's threaded copy."""
    num_kv_heads, head_dim, block_size, num_blocks = 2, 64, 16, 8
    fused = torch.randn(num_tokens, 3 * num_kv_heads * head_dim).to(DEVICE, dtype)
    key, value = (
        fused[:, n * num_kv_heads * head_dim : (n + 1) * num_kv_heads * head_dim].view(
            num_tokens, num_kv_heads, head_dim
        )
        for n in (1, 2)
    )
    slots = torch.randperm(num_blocks * block_size)[:num_tokens].to(DEVICE)
    slots[torch.randperm(num_tokens)[:3]] = -1
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache, value_cache = (torch.randn(cache_shape).to(DEVICE, dtype) for _ in range(2))
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    stored = slots >= 0
    TorchAttention().store_kv(
        key[stored], value[stored], expected_key, expected_value, slots[stored]
    )

    backend().store_kv(key, value, key_cache, value_cache, slots)

    assert torch.equal(key_cache, expected_key), f"seed {seed}"
    assert torch.equal(value_cache, expected_value), f"seed {seed}"


def test_torch_store_kv_skips_negative_slots():
    """Slot -1 is a padding row: it must not land in the cache's last slot."""
    key_cache, value_cache = torch.zeros(2, 4, 1, 2), torch.zeros(2, 4, 1, 2)
    key = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
    TorchAttention().store_kv(key, -key, key_cache, value_cache, torch.tensor([3, -1]))
    assert key_cache.flatten().tolist() == [0.0] * 6 + [1.0, 1.0] + [0.0] * 8
    assert value_cache.flatten().tolist() == [0.0] * 6 + [-1.0, -1.0] + [0.0] * 8


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (32, 8), (14, 2), (64, 1)])
@pytest.mark.parametrize("head_dim", [16, 48, 64, 128, 256])
@pytest.mark.parametrize("max_query_len", [1, 3, 64, 2048])
def test_launch_is_valid_on_a_gpu(num_heads, num_kv_heads, head_dim, max_query_len):
    """Power-of-two tiles, every tl.dot dimension at least 16, and the grid covers every
    (sequence, kv head, query token)."""
    launch = attention_launch(5, num_heads, num_kv_heads, head_dim, max_query_len, torch.bfloat16)
    for size in (launch.block_m, launch.block_n, launch.head_pad, launch.block_q):
        assert size & (size - 1) == 0
    assert min(launch.block_m, launch.block_n, launch.head_pad) >= 16
    assert launch.head_pad >= head_dim
    assert launch.group_pad >= launch.group == num_heads // num_kv_heads
    assert launch.grid == (5, num_kv_heads, launch.q_tiles * launch.num_splits)
    assert (launch.q_tiles - 1) * launch.block_q < max_query_len <= launch.q_tiles * launch.block_q
    assert launch.block_m == (16 if max_query_len == 1 else 64) or launch.block_q == 1
    assert launch.num_splits & (launch.num_splits - 1) == 0
    assert launch.num_splits == 1 or max_query_len == 1


@pytest.mark.parametrize(
    ("num_seqs", "max_query_len", "splits"),
    [(1, 1, 32), (2, 1, 32), (4, 1, 16), (16, 1, 4), (24, 1, 2), (63, 1, 1), (64, 1, 1), (1, 7, 1)],
)
def test_decode_launch_splits_the_keys_of_small_batches(num_seqs, max_query_len, splits):
    """Llama-3-8B's heads (32 query, 8 kv): a decode batch of fewer than 64 sequences fills
    about 512 programs with a power of two of key ranges each, at most 32; prefill never."""
    launch = attention_launch(num_seqs, 32, 8, 128, max_query_len, torch.bfloat16)
    assert launch.num_splits == splits


@pytest.mark.parametrize("splits", [1, 2, 4, 32])
def test_every_number_of_key_splits_gives_the_same_attention(seed, splits):
    """One decode batch (contexts from 1 token to many key tiles, so some ranges are empty)
    through launches with each number of splits: all match the torch path."""
    batch = make_batch(
        [1] * 4, [1, 33, 300, 1000], num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32
    )
    TorchAttention().store_kv(
        batch.key, batch.value, batch.key_cache, batch.value_cache, batch.meta.slot_mapping
    )
    launch = dataclasses.replace(attention_launch(4, 8, 2, 64, 1, torch.float32), num_splits=splits)
    out = paged_attention(launch, batch.query, batch.key_cache, batch.value_cache, batch.meta, 0.1)
    expected = TorchAttention().attend(
        batch.query, batch.key_cache, batch.value_cache, batch.meta, 0.1
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


LAUNCH_VARIANTS = {
    "key-tile-16": dict(block_n=16),
    "key-tile-64": dict(block_n=64),
    "native-dots": dict(native_dots=True),
    "native-64": dict(native_dots=True, block_n=64, num_warps=8),
    "one-stage": dict(num_stages=1, num_warps=2),
}
# Triton's interpreter multiplies bf16 operands as their raw 16-bit patterns: native bf16
# dots run on a GPU only (fp16's are the same kernel code and run everywhere).
NATIVE_DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(
        torch.bfloat16,
        id="bf16",
        marks=pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 dots need a GPU"),
    ),
]


@pytest.mark.parametrize("wide_offsets", [False, True], ids=["int32-offsets", "int64-offsets"])
@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("variant", LAUNCH_VARIANTS)
@pytest.mark.parametrize("phase", ["mixed", "split-decode"])
def test_every_launch_variant_matches_torch(seed, phase, variant, dtype, wide_offsets, monkeypatch):
    """The tile choices attention_sweep.py weighs (key tile, native dots, warps, stages)
    and 32- or 64-bit cache offsets all compute the same attention: a mixed batch of
    prefill chunks and decodes, and a decode batch with its keys split in four."""
    if wide_offsets:
        monkeypatch.setattr(triton_backend, "INT32_OFFSETS", 0)
    if phase == "mixed":
        query_lens, seq_lens, shared = MIXED_QUERY_LENS, MIXED_SEQ_LENS, MIXED_SHARED
    else:
        query_lens, seq_lens, shared = [1] * 4, [1, 33, 300, 1000], {}
    batch = make_batch(
        query_lens, seq_lens, num_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype, shared=shared
    )
    launch = attention_launch(len(seq_lens), 8, 2, 64, max(query_lens), dtype)
    splits = 4 if phase == "split-decode" else 1
    launch = dataclasses.replace(launch, **LAUNCH_VARIANTS[variant], num_splits=splits)

    class Variant(TritonAttention):
        def attend(self, query, key_cache, value_cache, meta, scale):
            return paged_attention(launch, query, key_cache, value_cache, meta, scale)

    check_attention(batch, seed, Variant)


@pytest.mark.parametrize(
    ("dtype", "max_query_len", "tiles"),
    [
        (torch.bfloat16, 1, (64, 2, True)),
        (torch.float16, 1, (64, 2, True)),
        (torch.float32, 1, (32, 8, False)),
        (torch.bfloat16, 9, (32, 8, False)),
    ],
)
def test_16_bit_decode_launches_take_the_swept_tiles(dtype, max_query_len, tiles):
    """Llama-3-8B's heads: a bf16/fp16 decode launch takes 64-key tiles, two warps and
    native dots (attention_sweep.py's pick on an H200); fp32 and prefill launches keep
    32-key tiles, eight warps and fp32 dots, which fit their registers."""
    launch = attention_launch(16, 32, 8, 128, max_query_len, dtype)
    assert (launch.block_n, launch.num_warps, launch.native_dots) == tiles


def test_launch_rejects_uneven_gqa():
    with pytest.raises(ValueError, match="num_heads 6 is not a multiple of num_kv_heads 4"):
        attention_launch(1, 6, 4, 64, 1, torch.bfloat16)


@pytest.mark.parametrize(
    ("device", "choice", "expected"),
    [
        ("cpu", "auto", "cpu"),
        ("cpu", "cpu", "cpu"),
        ("cuda", "auto", "triton"),
        ("cpu", "triton", "triton"),
        ("cuda", "torch", "torch"),
        ("cuda", "triton", "triton"),
        ("cpu", "torch", "torch"),
    ],
)
def test_select_backend(device, choice, expected):
    backend = select_backend(torch.device(device), choice)
    assert backend.name == expected
    classes = {"torch": TorchAttention, "cpu": CPUAttention, "triton": TritonAttention}
    assert type(backend) is classes[expected]


def test_select_backend_without_a_c_compiler_takes_torch(monkeypatch):
    monkeypatch.setattr(cpu_library, "available", lambda: False)
    assert type(select_backend(torch.device("cpu"))) is TorchAttention


def test_cpu_backend_refuses_cuda():
    with pytest.raises(ValueError, match="the cpu attention backend runs on the CPU only"):
        select_backend(torch.device("cuda"), "cpu")


def test_select_backend_rejects_unknown_choice():
    with pytest.raises(ValueError) as error:
        select_backend(torch.device("cpu"), "flash")
    assert str(error.value) == (
        "attention backend must be one of ('auto', 'torch', 'cpu', 'triton'), got 'flash'"
    )


def test_kernels_run_interpreted_without_cuda():
    """Guards the conftest switch: on CPU the kernels must be the interpreter's."""
    from triton.runtime.interpreter import InterpretedFunction

    from kvserve.engine.kernels.triton_attention import paged_attention_kernel

    assert isinstance(paged_attention_kernel, InterpretedFunction) != torch.cuda.is_available()


@pytest.mark.parametrize("family", ["llama", "llama3-tied"])
def test_engine_on_triton_matches_transformers(checkpoint, family):
    """The kernels inside the model: chunked prompts in mixed batches with decodes, and
    shared prefixes read from cached blocks, give transformers' greedy tokens."""
    path = str(checkpoint(family))
    config = EngineConfig(
        model=path,
        dtype="float32",
        attention_backend="triton",
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
    )
    engine = LLMEngine(config)
    prefix = [7, 100, 200, 300, 31, 41, 59, 26, 53]
    prompts = [[*prefix, 11, 12, 13], [*prefix, 14], [400, 401, 402, 403, 404, 405, 406]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("0", prompts[0], params)
    engine.add_request("2", prompts[2], params)
    results, seen = {}, JoinedOutputs()
    for step in itertools.count():
        if step == 2:  # the shared prefix is cached by now
            engine.add_request("1", prompts[1], params)
        elif not engine.has_unfinished_requests():
            break
        for out in seen.add(engine.step()):
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
    for i, prompt in enumerate(prompts):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, 6), results[str(i)])
    assert engine.stats.prefix_cache_hits == 8


def test_a_mixed_batch_padded_to_a_larger_launch_gives_the_same_rows(seed):
    """What a full CUDA graph of a mixed batch (decodes and small prefill chunks) relies on:
    a launch sized for a bucket (more sequences, those of no query token; a larger largest
    query) computes the real rows exactly as the launch sized for the batch, since the
    kernel reads the lengths from the device and skips the tiles past each query."""
    batch = make_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        shared=MIXED_SHARED,
    )
    TorchAttention().store_kv(
        batch.key, batch.value, batch.key_cache, batch.value_cache, batch.meta.slot_mapping
    )
    meta, pad = batch.meta, 3
    launch = functools.partial(attention_launch, num_heads=4, num_kv_heads=2)
    exact = paged_attention(
        launch(len(MIXED_SEQ_LENS), head_dim=64, max_query_len=meta.max_query_len,
               dtype=torch.float32),
        batch.query, batch.key_cache, batch.value_cache, meta, 0.125,
    )  # fmt: skip
    ends = meta.query_start_loc
    padded_meta = dataclasses.replace(
        meta,
        query_start_loc=torch.cat([ends, ends[-1:].repeat(pad)]),
        seq_lens=torch.cat([meta.seq_lens, torch.ones(pad, dtype=torch.int32)]),
        block_tables=torch.cat([meta.block_tables, meta.block_tables[:1].repeat(pad, 1)]),
        query_lens_host=[*meta.query_lens_host, *[0] * pad],
        seq_lens_host=[*meta.seq_lens_host, *[1] * pad],
        max_query_len=128,
    )
    padded = paged_attention(
        launch(len(MIXED_SEQ_LENS) + pad, head_dim=64, max_query_len=128, dtype=torch.float32),
        batch.query, batch.key_cache, batch.value_cache, padded_meta, 0.125,
    )  # fmt: skip
    assert torch.equal(padded, exact)
