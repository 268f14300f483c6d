"""KV-cache sizing on CUDA: the arithmetic with given memory figures, the profiling step's
shape, and its batch run for real on the CPU."""

import logging

import pytest
import torch

from kvserve.engine.kv_cache_sizing import (
    MemoryProfile,
    kv_cache_blocks,
    profile_query_lens,
    profile_step,
)
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig

from reference import hf_model

GIB = 2**30
MIB = 2**20


def test_blocks_fill_the_allowed_share_less_what_is_used(caplog):
    profile = MemoryProfile(
        total_bytes=80 * GIB, peak_torch_bytes=20 * GIB, non_torch_bytes=GIB + 3 * MIB
    )
    with caplog.at_level(logging.INFO, logger="kvserve.engine.kv_cache_sizing"):
        blocks = kv_cache_blocks(profile, 0.9, 2 * MIB)
    # 72 GiB allowed - 20 GiB - (1 GiB + 3 MiB) = 52221 MiB, in blocks of 2 MiB
    assert blocks == 26110
    assert caplog.messages == [
        "KV cache: 26110 blocks (51.00 GiB) = 72.00 GiB (0.90 of 80.00 GiB) - 20.00 GiB "
        "weights and activations - 1.00 GiB outside torch"
    ]


def test_no_room_for_a_block_is_an_error():
    profile = MemoryProfile(total_bytes=16 * GIB, peak_torch_bytes=14 * GIB, non_torch_bytes=GIB)
    with pytest.raises(ValueError) as error:
        kv_cache_blocks(profile, 0.9, MIB)
    assert str(error.value) == (
        "gpu_memory_utilization 0.9 leaves no room for a KV block: 14.40 GiB allowed, "
        "14.00 GiB for the weights and activations, 1.00 GiB outside torch; raise it or "
        "lower max_num_batched_tokens"
    )


@pytest.mark.parametrize(
    ("budget", "max_seqs", "max_len", "expected"),
    [
        (2048, 64, 4096, [32] * 64),
        (100, 64, 4096, [2] * 36 + [1] * 28),
        (10, 3, 100, [4, 3, 3]),
        (8, 64, 4096, [1] * 8),
        (2048, 1, 512, [512]),
        (2048, 2, 600, [600, 600]),
    ],
)
def test_profile_batch_is_the_largest_step(budget, max_seqs, max_len, expected):
    assert profile_query_lens(budget, max_seqs, max_len) == expected


@pytest.fixture
def tiny_model(checkpoint):
    path = checkpoint("llama")
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, torch.device("cpu"))
    return path, model


def test_profile_step_is_a_real_prefill(tiny_model):
    """One prompt that fits the one-block cache gives the true last-token logits."""
    path, model = tiny_model
    with torch.inference_mode():
        logits = profile_step(model, [7], 8, torch.float32, torch.device("cpu"))
        expected = hf_model(str(path))(torch.zeros(1, 7, dtype=torch.long)).logits[:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_profile_step_runs_the_full_batch(tiny_model):
    _, model = tiny_model
    lens = profile_query_lens(50, 4, 64)
    with torch.inference_mode():
        logits = profile_step(model, lens, 4, torch.float32, torch.device("cpu"))
    assert logits.shape == (4, model.config.vocab_size)
    assert torch.isfinite(logits).all()
