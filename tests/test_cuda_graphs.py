"""CUDA-graph decode: batch-size buckets, the padded static batch (run eagerly, on the CPU
through the interpreted Triton kernels), and graphs captured on CUDA only."""

import pytest
import torch

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.graphs.cuda_graphs import CUDAGraphs, use_cuda_graphs
from kvserve.engine.graphs.graph_buckets import (
    Bucket,
    MixedBuckets,
    capture_sizes,
    padded_size,
)
from kvserve.engine.graphs.static_batch import StaticDecodeBatch
from kvserve.engine.llm_engine import LLMEngine

from checkpoints import build_checkpoint


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (10, [1, 2, 4, 8, 10]),
        (64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
    ],
)
def test_capture_sizes(max_num_seqs, expected):
    assert capture_sizes(max_num_seqs) == expected


@pytest.mark.parametrize(
    ("num_seqs", "expected"),
    [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (57, 64), (65, None)],
)
def test_batches_pad_up_to_the_next_captured_size(num_seqs, expected):
    assert padded_size(num_seqs, capture_sizes(64)) == expected


@pytest.mark.parametrize(
    ("device", "backend", "enforce_eager", "expected"),
    [
        ("cuda", "triton", False, True),
        ("cuda", "triton", True, False),
        ("cuda", "torch", False, False),
        ("cpu", "triton", False, False),
        ("cpu", "torch", False, False),
    ],
)
def test_graphs_only_for_triton_on_cuda(device, backend, enforce_eager, expected):
    assert use_cuda_graphs(torch.device(device), backend, enforce_eager) is expected


@pytest.fixture
def decoding_engine(checkpoint):
    """An engine on the Triton path (interpreted on a CPU) with three requests past prefill."""
    engine = LLMEngine(
        EngineConfig(
            model=str(checkpoint("llama")),
            dtype="float32",
            attention_backend="triton",
            num_kv_blocks=32,
            block_size=4,
        )
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20]]):
        engine.add_request(str(i), prompt, params)
    engine.step()
    return engine


def test_only_a_cuda_engine_captures_graphs(decoding_engine):
    runner = decoding_engine.runner
    if runner.plan.device.type == "cuda":
        assert isinstance(runner.forward, CUDAGraphs)
        plan = runner.plan
        decode = [Bucket(size, size, 1) for size in capture_sizes(plan.max_num_seqs)]
        mixed = MixedBuckets(min(512, plan.max_num_batched_tokens), plan.max_num_seqs).all()
        assert sorted(runner.forward.graphs) == sorted([*decode, *mixed])
    else:
        assert runner.forward is runner.model


def test_padded_static_batch_computes_the_same_rows(decoding_engine):
    """A 3-sequence decode batch padded to 4 in static tensors holding a previous batch:
    the padding row writes no KV slot and the real rows equal the unpadded run."""
    runner = decoding_engine.runner
    out = decoding_engine.scheduler.schedule()
    assert [n for _, n in out.scheduled] == [1, 1, 1]
    inputs = runner.prepare(out)
    meta = inputs.meta
    static = StaticDecodeBatch(max_size=8, max_blocks_per_seq=5, device=runner.plan.device)
    static.slot_mapping.fill_(3)
    static.seq_lens.fill_(9)
    static.block_tables.fill_(2)

    static.fill(inputs.input_ids, inputs.positions, meta, size=4)

    assert static.slot_mapping[0].tolist() == [*meta.slot_mapping.tolist(), -1, 3, 3, 3, 3]
    assert static.seq_lens.tolist() == [*meta.seq_lens.tolist(), 1, 9, 9, 9, 9]
    assert static.input_ids[:3].tolist() == inputs.input_ids.tolist()
    assert static.positions[:3].tolist() == inputs.positions.tolist()
    width = meta.block_tables.shape[1]
    assert static.block_tables[0, :3, :width].tolist() == meta.block_tables.tolist()
    assert static.query_start_loc.tolist() == list(range(9))

    with torch.inference_mode():
        expected = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, meta)
        caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        padded = runner.model(
            static.input_ids[:4], static.positions[:4], runner.kv_caches, static.meta(4)
        )
    torch.testing.assert_close(padded[:3], expected, rtol=1e-5, atol=1e-6)
    # The real rows rewrite their own slots with values equal up to rounding (a 4-row matmul
    # may round unlike a 3-row one); every other slot, the last one included, is untouched.
    real = meta.slot_mapping
    others = torch.ones(caches[0][0].flatten(0, 1).shape[0], dtype=torch.bool)
    others[real] = False
    for layer, layer_before in zip(runner.kv_caches, caches, strict=True):
        for after, before in zip(layer, layer_before, strict=True):
            after, before = after.flatten(0, 1), before.flatten(0, 1)
            torch.testing.assert_close(after[real], before[real], rtol=1e-5, atol=1e-6)
            assert torch.equal(after[others], before[others])


def test_a_padded_static_batch_of_two_kv_groups_computes_the_same_rows(tmp_path):
    """A model of two KV groups (Qwen2, its second layer windowed) on the Triton path: each
    group's slots and tables go to its own static rows, padding writes no slot of either,
    and the real rows equal the unpadded run."""
    path = build_checkpoint(
        "qwen2", tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=1
    )
    engine = LLMEngine(
        EngineConfig(
            model=str(path), dtype="float32", attention_backend="triton", num_kv_blocks=32,
            block_size=4,
        )
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19]]):
        engine.add_request(str(i), prompt, params)
    engine.step()
    runner = engine.runner
    inputs = runner.prepare(engine.scheduler.schedule())
    meta = inputs.meta
    assert isinstance(meta, list) and runner._static_layout() == [0, 1]
    static = StaticDecodeBatch(8, 5, runner.plan.device, runner._static_layout())
    static.slot_mapping.fill_(3)

    static.fill(inputs.input_ids, inputs.positions, meta, size=4)

    for group, layer_meta in enumerate(meta):
        expected = [*layer_meta.slot_mapping.tolist(), -1, 3, 3, 3, 3]
        assert static.slot_mapping[group].tolist() == expected
        width = layer_meta.block_tables.shape[1]
        assert static.block_tables[group, :3, :width].tolist() == layer_meta.block_tables.tolist()
    assert meta[0].block_tables.tolist() != meta[1].block_tables.tolist()  # blocks of its own
    with torch.inference_mode():
        expected = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, meta)
        padded = runner.model(
            static.input_ids[:4], static.positions[:4], runner.kv_caches, static.meta(4)
        )
    torch.testing.assert_close(padded[:3], expected, rtol=1e-5, atol=1e-6)


SYNC_WARNING = "called a synchronizing CUDA operation"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA synchronisations")
def test_a_decode_step_syncs_once(decoding_engine):
    """Only reading the sampled ids waits for the device: inputs go up through pinned
    memory and the sampler's parameters too; penalties and ``min_tokens`` read and update
    the history on the device."""
    import warnings

    decoding_engine.add_request(
        "sampled", [21, 22, 23], SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1)
    )
    decoding_engine.add_request(
        "penalised",
        [24, 25, 26],
        SamplingParams(
            temperature=0,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.2,
            min_tokens=8,
            max_tokens=16,
        ),
    )
    decoding_engine.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            decoding_engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch also warns, once per process, that the debug mode is a prototype: not counted
    syncs = [w for w in caught if str(w.message).startswith(SYNC_WARNING)]
    assert len(syncs) == 1
