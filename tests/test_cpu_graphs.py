"""Decode steps replayed from recorded kernel calls on a CPU: the same logits as eager steps,
bit for bit; sizes whose step computes in torch refused; recordings within their budget."""

import pytest
import torch

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.graphs.cpu_graphs import CPUDecodeGraphs, Recording, use_cpu_graphs
from kvserve.engine.kernels import cpu_library
from kvserve.engine.kernels.cpu_signatures import SIGNATURES
from kvserve.engine.kernels.row_argmax import row_argmax
from kvserve.engine.layers import fused_ops
from kvserve.engine.layers.cpu_linear import packed_linear
from kvserve.engine.llm_engine import LLMEngine

from checkpoints import build_checkpoint
from gemma_checkpoints import build_gemma3
from hybrid_checkpoints import build_qwen3_5

pytestmark = pytest.mark.skipif(not cpu_library.available(), reason="needs the C kernels")

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20], [21, 22]]
MAX_TOKENS = [9, 4, 9, 6]  # decode batches of 4, then 3, then 2 sequences


def run(checkpoint, family: str, dtype: str, enforce_eager: bool):
    """Every step's logits, and the engine, over PROMPTS (one prefill step, then decodes)."""
    return run_path(checkpoint(family), dtype, enforce_eager)


def run_path(path, dtype: str, enforce_eager: bool):
    """``run`` on the checkpoint at ``path``."""
    engine = LLMEngine(
        EngineConfig(
            model=str(path),
            dtype=dtype,
            device="cpu",
            enforce_eager=enforce_eager,
            num_kv_blocks=32,
            block_size=4,
        )
    )
    return run_prompts(engine, "first"), engine


def run_prompts(engine: LLMEngine, name: str) -> list[torch.Tensor]:
    """Every step's logits over PROMPTS, requests named ``name`` and their index."""
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        engine.add_request(f"{name}-{i}", prompt, SamplingParams(temperature=0, max_tokens=n))
    logits = []
    execute = engine.runner.execute

    def kept(out):
        logits.append(execute(out))
        return logits[-1]

    engine.runner.execute = kept
    while engine.has_unfinished_requests():
        engine.step()
    engine.runner.execute = execute
    return logits


@pytest.mark.parametrize(
    ("device", "backend", "enforce_eager", "expected"),
    [
        ("cpu", "cpu", False, True),
        ("cpu", "cpu", True, False),
        ("cpu", "torch", False, False),
        ("cuda", "triton", False, False),
    ],
)
def test_recordings_only_on_the_cpu_kernels_path(device, backend, enforce_eager, expected):
    assert use_cpu_graphs(torch.device(device), backend, enforce_eager) is expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen2-grouped", "qwen3"])
def test_replayed_decode_steps_give_the_eager_logits_bit_for_bit(
    checkpoint, family, dtype, monkeypatch
):
    replays: list[int] = []
    replay = Recording.replay
    monkeypatch.setattr(Recording, "replay", lambda self: (replays.append(1), replay(self)))
    eager, eager_engine = run(checkpoint, family, dtype, enforce_eager=True)
    assert eager_engine.runner.forward is eager_engine.runner.model
    assert replays == []

    replayed, engine = run(checkpoint, family, dtype, enforce_eager=False)

    graphs = engine.runner.forward
    assert isinstance(graphs, CPUDecodeGraphs)
    # after the prefill, 8 decode steps: 3 of 4 sequences, 2 of 3, 3 of 2; the first of each
    # size recorded (and size 1 by the warm-up's one-token step), the others replayed
    assert (sorted(graphs.recordings), graphs.refused) == ([1, 2, 3, 4], set())
    assert len(replays) == 8 - 3
    assert [t.shape[0] for t in replayed] == [4, 4, 4, 4, 3, 3, 2, 2, 2]
    assert len(replayed) == len(eager)
    for step, (ours, theirs) in enumerate(zip(replayed, eager, strict=True)):
        assert torch.equal(ours, theirs), f"step {step}"


HYBRID_MODELS = {
    # two KV groups (full, windowed), every op a kernel: each size recorded, then replayed
    "qwen2-windowed": lambda path: build_checkpoint(
        "qwen2", path, use_sliding_window=True, sliding_window=4, max_window_layers=1
    ),
    # three KV groups; GeGLU's GELU computes in torch: each size's first step runs on the
    # static buffers, then the size is refused
    "gemma3": build_gemma3,
    # a full-attention group and state slots; the delta rule computes in torch: as Gemma 3
    "qwen3_5": lambda path: build_qwen3_5(path, "qwen3_5_text"),
}


@pytest.mark.parametrize("model", HYBRID_MODELS)
def test_models_of_several_kv_groups_or_state_slots_decode_on_static_buffers(tmp_path, model):
    """Each group's slot mapping and block tables, the state slots and their flags are
    copied into static buffers: the recorded (or recording) steps give the eager logits
    bit for bit."""
    path = HYBRID_MODELS[model](tmp_path / model)
    eager, _ = run_path(path, "float32", enforce_eager=True)
    replayed, engine = run_path(path, "float32", enforce_eager=False)
    graphs = engine.runner.forward
    assert isinstance(graphs, CPUDecodeGraphs)
    assert len(graphs.static.layout) == engine.model_config.num_layers
    recorded = (sorted(graphs.recordings), graphs.refused)
    assert recorded == (([1, 2, 3, 4], set()) if model == "qwen2-windowed" else ([], {1, 2, 3, 4}))
    assert len(replayed) == len(eager)
    for step, (ours, theirs) in enumerate(zip(replayed, eager, strict=True)):
        assert torch.equal(ours, theirs), f"step {step}"


def test_a_size_whose_step_computes_in_torch_runs_eagerly(checkpoint, monkeypatch):
    """SiLU-and-mul on its torch path: no recording is kept (it would lose that op), each
    size is refused once and for all, and the logits are still the eager ones."""
    monkeypatch.setattr(fused_ops, "silu_and_mul", fused_ops.silu_and_mul_reference)
    eager, _ = run(checkpoint, "llama", "float32", enforce_eager=True)

    logits, engine = run(checkpoint, "llama", "float32", enforce_eager=False)

    graphs = engine.runner.forward
    assert (graphs.recordings, graphs.refused) == ({}, {1, 2, 3, 4})
    for ours, theirs in zip(logits, eager, strict=True):
        assert torch.equal(ours, theirs)


def test_a_model_on_onednn_packed_weights_runs_eagerly(checkpoint, monkeypatch):
    """Linears on oneDNN's packed weights (where no kernel of the project takes a layer, e.g.
    a bf16 shape the AMX and AVX-512-BF16 kernels refuse): those weights have no storage to
    compare, and the linears compute in torch, so each size is refused, not recorded (it had
    raised from the dispatch mode and failed every decode step), and the logits are the
    eager ones."""
    monkeypatch.setattr(packed_linear, "packed", packed_linear.PackedLinear)
    eager, _ = run(checkpoint, "llama", "float32", enforce_eager=True)

    logits, engine = run(checkpoint, "llama", "float32", enforce_eager=False)

    graphs = engine.runner.forward
    assert isinstance(graphs.model.layers[0].mlp.down_proj.kernel, packed_linear.PackedLinear)
    assert (graphs.recordings, graphs.refused) == ({}, {1, 2, 3, 4})
    for ours, theirs in zip(logits, eager, strict=True):
        assert torch.equal(ours, theirs)


def test_a_step_after_the_thread_count_changed_records_anew(checkpoint):
    """The calls pass the kernels the thread count of their recording; once torch's count
    changes, each size records again on the new count, and the logits are the eager
    ones at that count, bit for bit."""
    threads = torch.get_num_threads()
    other = 1 if threads > 1 else 2
    _, engine = run(checkpoint, "llama", "float32", enforce_eager=False)
    graphs = engine.runner.forward
    assert {r.threads for r in graphs.recordings.values()} == {threads}
    try:
        torch.set_num_threads(other)
        replayed = run_prompts(engine, "again")
        eager, _ = run(checkpoint, "llama", "float32", enforce_eager=True)
    finally:
        torch.set_num_threads(threads)
    # sizes 4, 3 and 2 ran again; size 1 (the warm-up's) did not
    recorded = {n: r.threads for n, r in graphs.recordings.items()}
    assert recorded == {1: threads, 2: other, 3: other, 4: other}
    for step, (ours, theirs) in enumerate(zip(replayed, eager, strict=True)):
        assert torch.equal(ours, theirs), f"step {step}"


def test_recordings_are_kept_within_their_bytes_least_recently_used_first_out(checkpoint):
    _, engine = run(checkpoint, "llama", "float32", enforce_eager=False)
    graphs = engine.runner.forward
    graphs.recordings.clear()
    graphs.max_bytes = 300

    def recording(size: int) -> Recording:
        return Recording([], torch.empty(0), [], size, 1)

    graphs._keep(1, recording(100))
    graphs._keep(2, recording(150))
    graphs.recordings.move_to_end(1)  # replayed: now the most recently used
    graphs._keep(3, recording(100))
    assert list(graphs.recordings) == [1, 3]
    graphs._keep(4, recording(301))
    assert (list(graphs.recordings), graphs.refused) == ([1, 3], {4})


def test_a_recorded_kernel_call_replays_on_its_addresses():
    x = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    with cpu_library.recording() as calls:
        out = row_argmax(x)
    assert [c.kernel for c in calls] == ["row_argmax"]
    assert out.tolist() == [1, 0]
    x.copy_(torch.tensor([[5.0, 3.0, 1.0], [2.0, 0.0, 7.0]]))
    calls[0]()
    assert out.tolist() == [0, 2]
    row_argmax(x)
    assert len(calls) == 1  # the recording closed with its block


def test_a_failing_replayed_call_raises():
    names = SIGNATURES["paged_decode"].names
    args = tuple(cpu_library.ISAS["avx2"] if name == "isa" else 0 for name in names)
    call = cpu_library.KernelCall(lambda *args: -2, args, "paged_decode")
    with pytest.raises(RuntimeError, match=r"^paged_decode failed \(-2\) on the avx2 path$"):
        call()
