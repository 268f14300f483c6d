"""The FP8 KV cache's kernels: the C kernels on each SIMD path this CPU runs and the Triton
kernels (in the interpreter without CUDA) against the torch path.

Stores are exact: every backend writes the bytes of ``fp8_kv.quantize`` (float32 times the
reciprocal scale, clamped to ±448, rounded to nearest even). Attention over an e4m3 cache
reads exact values (``stored * scale`` widens without rounding), so it must match the torch
path run in float32 on the same cache to the 16-bit path's own tolerance (1e-5 relative to
the largest output in float32, 1e-2 in bfloat16).
"""

import functools

import pytest
import torch
from test_triton_attention import (
    BACKENDS,
    DEVICE,
    MIXED_QUERY_LENS,
    MIXED_SEQ_LENS,
    MIXED_SHARED,
    TOLERANCE,
    device_of,
    make_batch,
    seed,  # noqa: F401 - the fixture
)

from kvserve.engine.layers.attention.fp8_kv import FP8, KVScales, quantize
from kvserve.engine.layers.attention.torch_backend import TorchAttention

SCALES = [
    pytest.param(KVScales(), id="unit-scales"),
    pytest.param(KVScales(0.05, 0.0123), id="checkpoint-scales"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("backend", [pytest.param(TorchAttention, id="torch"), *BACKENDS])
def test_store_writes_the_rounded_bytes(backend, scales, dtype):
    """Keys and values of every magnitude: saturating past ±448 · scale, subnormal below
    2^-6 · scale, ties; a padding slot (-1) writes nothing."""
    device = device_of(backend)
    num_tokens, kv_heads, head_dim = 40, 2, 32
    key = torch.randn(num_tokens, kv_heads, head_dim) * 600 * scales.k
    key[0, 0, :8] = torch.tensor([448.0, 460.0, -1e4, 2**-7, -(2**-10), 3 * 2**-10, 31.5, 0.0])
    key[0, 0, :8] *= scales.k
    value = torch.randn(num_tokens, kv_heads, head_dim) * torch.logspace(-4, 2, head_dim)
    value *= scales.v
    key, value = key.to(device, dtype), value.to(device, dtype)
    slots = torch.randperm(64)[:num_tokens].to(device)
    slots[5] = -1
    shape = (4, 16, kv_heads, head_dim)
    key_cache, value_cache = (torch.zeros(shape, dtype=FP8, device=device) for _ in range(2))
    backend().store_kv(key, value, key_cache, value_cache, slots, scales)
    kept = slots >= 0
    expected_keys = torch.zeros(64, kv_heads, head_dim, dtype=FP8)
    expected_values = torch.zeros(64, kv_heads, head_dim, dtype=FP8)
    expected_keys[slots[kept].cpu()] = quantize(key[kept].cpu(), scales.k)
    expected_values[slots[kept].cpu()] = quantize(value[kept].cpu(), scales.v)
    as_bytes = functools.partial(torch.Tensor.view, dtype=torch.uint8)
    assert torch.equal(as_bytes(key_cache.cpu().flatten(0, 1)), as_bytes(expected_keys))
    assert torch.equal(as_bytes(value_cache.cpu().flatten(0, 1)), as_bytes(expected_values))
    if scales == KVScales():  # the rule itself: saturation, subnormals, ties to even, sign
        first = as_bytes(key_cache.cpu().flatten(0, 1))[int(slots[0]), 0, :8]
        assert first.tolist() == [0x7E, 0x7E, 0xFE, 0x04, 0x80, 0x02, 0x60, 0x00]


CASES = {
    "mixed": (MIXED_QUERY_LENS, MIXED_SEQ_LENS, MIXED_SHARED),
    # a long decode whose keys the kernels split into ranges, and a short one
    "split-decode": ([1, 1], [300, 37], {}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [32, 24])  # 24: the CPU backend's torch path
def test_attention_reads_the_fp8_cache(backend, head_dim, scales, dtype, case, seed):  # noqa: F811
    """bf16 dot products (cpu-avx512-bf16-dots) are not taken over an e4m3 cache."""
    query_lens, seq_lens, shared = CASES[case]
    batch = make_batch(
        query_lens,
        seq_lens,
        num_heads=6,
        num_kv_heads=2,
        head_dim=head_dim,
        dtype=dtype,
        shared=shared,
        device=device_of(backend),
    )
    key_cache = quantize(batch.key_cache.float() * scales.k, scales.k)
    value_cache = quantize(batch.value_cache.float() * scales.v, scales.v)
    TorchAttention().store_kv(
        batch.key, batch.value, key_cache, value_cache, batch.meta.slot_mapping, scales
    )
    scale = head_dim**-0.5
    out = backend().attend(batch.query, key_cache, value_cache, batch.meta, scale, scales)
    reference = TorchAttention().attend(
        batch.query.float(), key_cache, value_cache, batch.meta, scale, scales
    )
    assert out.dtype == batch.query.dtype and out.shape == batch.query.shape
    error = ((out.float() - reference).abs().max() / reference.abs().max()).item()
    assert error <= TOLERANCE[dtype], f"relative error {error:.3g} (seed {seed})"


def test_torch_path_reads_stored_times_scale():
    """The reference itself: one key and value, so the output is the value read back."""
    batch = make_batch([1], [1], num_heads=1, num_kv_heads=1, head_dim=16, dtype=torch.float32)
    scales = KVScales(0.5, 0.25)
    key_cache, value_cache = (torch.zeros_like(batch.key_cache, dtype=FP8) for _ in range(2))
    value = torch.arange(16, dtype=torch.float32).view(1, 1, 16) * 0.25
    TorchAttention().store_kv(
        batch.key, value.to(DEVICE), key_cache, value_cache, batch.meta.slot_mapping, scales
    )
    slot = int(batch.meta.slot_mapping[0])
    assert value_cache.flatten(0, 1)[slot, 0].float().tolist() == list(range(16))
    out = TorchAttention().attend(batch.query, key_cache, value_cache, batch.meta, 1.0, scales)
    assert torch.equal(out.cpu(), value)


@pytest.mark.parametrize("backend", [pytest.param(TorchAttention, id="torch"), *BACKENDS])
def test_a_16_bit_cache_ignores_the_scales(backend, seed):  # noqa: F811
    """A checkpoint's k/v scales with ``--kv-cache-dtype auto``: the same bits as without."""
    batch = make_batch(
        MIXED_QUERY_LENS,
        MIXED_SEQ_LENS,
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        dtype=torch.float32,
        shared=MIXED_SHARED,
        device=device_of(backend),
    )
    caches = [(batch.key_cache.clone(), batch.value_cache.clone()) for _ in range(2)]
    outputs = []
    for (key_cache, value_cache), scales in zip(
        caches, (KVScales(), KVScales(0.05, 4.0)), strict=True
    ):
        slots = batch.meta.slot_mapping
        backend().store_kv(batch.key, batch.value, key_cache, value_cache, slots, scales)
        outputs.append(
            backend().attend(batch.query, key_cache, value_cache, batch.meta, 0.2, scales)
        )
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    assert torch.equal(outputs[0], outputs[1])
