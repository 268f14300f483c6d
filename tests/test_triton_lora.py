"""The batched LoRA kernels (shrink, expand) on the GPU or in Triton's interpreter
(tests/conftest.py) against a float64 torch reference, and ``LoRALinear``'s kernel path
against its torch path.

A batch mixes rows of several adapter slots (ranks 8 and 16 padded to ``max_rank``) with
rows of the base model, over one, two or three output parts (o/down, gate/up, q/k/v). B's
blocks off its diagonal are NaN: the expand must never read them. Base rows must come back
bit for bit. Tolerances, per element, against the float64 ``ref``: ``|got - ref| <= rtol *
|ref| + atol * max|ref|``; fp32 rtol = atol = 2^-18 (summation order), fp16 2^-9 and 2^-10
(the shrunk rows rounded to fp16 for the native dot, the sum once), bf16 2^-7 and 2^-8 (the
interpreter's bf16 casts truncate).
"""

import numpy as np
import pytest
import torch
from joined_outputs import JoinedOutputs

from kvserve import LoRARequest, SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.kernels.lora_segments import lora_segments
from kvserve.engine.kernels.triton_lora import lora_expand, lora_shrink, shrink_split
from kvserve.engine.layers.linear import MergedColumnParallelLinear
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.lora.lora_linear import LoRABatch, LoRALinear

from lora_adapters import build_adapter, merged_checkpoint
from reference import assert_greedy_match, hf_greedy

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {
    torch.float16: (2**-9, 2**-10),
    torch.bfloat16: (2**-7, 2**-8),
    torch.float32: (2**-18, 2**-18),
}
DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float32, id="fp32"),
]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SLOT_RANKS = {0: 8, 2: 16, 3: 16}  # slot 1 is empty: no row names it; capped at max_rank


def stacks(sizes: list[int], k: int, max_rank: int, dtype: torch.dtype):
    """A ``[4, parts * max_rank, k]`` and B ``[4, sum(sizes), parts * max_rank]`` with each
    slot's rank rows/columns random, the rest of the part's rank zero and B off its
    diagonal blocks NaN."""
    parts, n = len(sizes), sum(sizes)
    a = torch.zeros(4, parts * max_rank, k, dtype=torch.float64)
    b = torch.full((4, n, parts * max_rank), float("nan"), dtype=torch.float64)
    offset = 0
    for p, size in enumerate(sizes):
        b[:, offset : offset + size, p * max_rank : (p + 1) * max_rank] = 0
        for slot, rank in SLOT_RANKS.items():
            rank = min(rank, max_rank)
            a[slot, p * max_rank : p * max_rank + rank] = torch.randn(rank, k) / k**0.5
            b[slot, offset : offset + size, p * max_rank : p * max_rank + rank] = torch.randn(
                size, rank
            )
        offset += size
    return a.to(dtype), b.to(dtype)


def reference(out, x, a, b, row_slots, sizes, max_rank, scale):
    """float64 ``out`` plus each adapter row's per-part ``scale * x A_pᵀ B_pᵀ``."""
    ref = out.double().clone()
    x, a, b = x.double(), a.double(), b.double()
    for row, slot in enumerate(row_slots.tolist()):
        if slot < 0:
            continue
        offset = 0
        for p, size in enumerate(sizes):
            ranks = slice(p * max_rank, (p + 1) * max_rank)
            shrunk = x[row] @ a[slot, ranks].T
            ref[row, offset : offset + size] += scale * (
                b[slot, offset : offset + size, ranks] @ shrunk
            )
            offset += size
    return ref


def assert_matches(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCES[dtype]
    error = (got.double().cpu() - ref).abs()
    bound = rtol * ref.abs() + atol * ref.abs().max()
    assert (error <= bound).all(), f"worst excess {(error - bound).max().item():.3g}"


def run_case(row_slots, sizes, k, max_rank, dtype, scale=1.0, split_k=None):
    row_slots = np.asarray(row_slots)
    torch.manual_seed(len(row_slots) * 131 + k + max_rank + len(sizes))
    a, b = stacks(sizes, k, max_rank, dtype)
    m = len(row_slots)
    x = torch.randn(m, k + 16).to(dtype)[:, 8 : k + 8]  # rows k + 16 apart
    out = torch.randn(m, sum(sizes)).to(dtype)
    expected = reference(out, x, a, b, row_slots, sizes, max_rank, scale)
    segments = lora_segments(row_slots, DEVICE)
    got = out.to(DEVICE)
    offsets = np.cumsum([0, *sizes[:-1]])
    shrunk = lora_shrink(x.to(DEVICE), a.to(DEVICE), segments, len(sizes), max_rank, split_k)
    lora_expand(
        got,
        shrunk,
        b.to(DEVICE),
        segments,
        torch.tensor(offsets, dtype=torch.int32, device=DEVICE),
        torch.tensor(sizes, dtype=torch.int32, device=DEVICE),
        max(sizes),
        max_rank,
        scale,
    )
    base_rows = torch.from_numpy(row_slots < 0)
    assert torch.equal(got.cpu()[base_rows], out[base_rows])
    assert got.dtype == dtype and not got.isnan().any()
    assert_matches(got, expected, dtype)


def test_segments_sort_the_adapter_rows_by_slot_and_leave_out_the_base_rows():
    segments = lora_segments(np.array([3, -1, 0, 3, 3, -1, 0, 2]), torch.device("cpu"))
    assert segments.rows.tolist() == [2, 6, 7, 0, 3, 4]
    assert segments.starts.tolist() == [0, 2, 3]
    assert segments.lengths.tolist() == [2, 1, 3]
    assert segments.slots.tolist() == [0, 2, 3]
    assert segments.max_length == 3 and segments.rows.dtype == torch.int32
    assert lora_segments(np.array([-1, -1]), torch.device("cpu")) is None


def test_the_k_loop_splits_until_about_256_programs():
    assert shrink_split(4096, 24) == (10, 448)  # 64 blocks in 10 spans of 7
    assert shrink_split(4096, 256) == (1, 4096)
    assert shrink_split(100, 8) == (2, 64)  # never more splits than K blocks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "sizes", [[48, 16, 16], [40, 40], [24]], ids=["qkv", "gate_up", "one_part"]
)
def test_mixed_adapters_and_base_rows(sizes, dtype):
    rng = np.random.default_rng(len(sizes))
    row_slots = rng.choice([-1, 0, 2, 3], size=37)
    run_case(row_slots, sizes, k=96, max_rank=16, dtype=dtype, scale=0.5)


@pytest.mark.parametrize("split_k", [1, 3])
def test_split_k_sums_to_the_same(split_k):
    run_case(
        [2, -1, 0, 2, 3], [48, 16, 16], k=160, max_rank=16, dtype=torch.float32, split_k=split_k
    )


def test_rank_8_stacks_and_a_single_row():
    run_case([0], [40, 40], k=64, max_rank=8, dtype=torch.float32)


def test_a_group_longer_than_a_small_row_tile():
    row_slots = np.array([-1] * 3 + [3] * 70 + [0] * 5)
    run_case(row_slots, [48, 16, 16], k=64, max_rank=16, dtype=torch.bfloat16)


def test_lora_linear_kernel_path_equals_its_torch_path():
    torch.manual_seed(0)
    base = MergedColumnParallelLinear(64, [40, 40], bias=False, tp=TensorParallel())
    torch.nn.init.normal_(base.weight)
    batch = LoRABatch()
    layer = LoRALinear(base, [(0, 40), (40, 40)], 4, 16, batch, DEVICE).to(DEVICE)
    for slot, rank in SLOT_RANKS.items():
        pairs = [(torch.randn(rank, 64), torch.randn(40, rank)) for _ in range(2)]
        layer.set_slot(slot, pairs)
    row_slots = np.array([2, -1, 0, 2, 3, 3, -1])
    x = torch.randn(7, 64, device=DEVICE)
    batch.groups = [
        (int(s), torch.from_numpy(np.flatnonzero(row_slots == s)).to(DEVICE)) for s in (0, 2, 3)
    ]
    torch_path = layer(x)
    batch.groups, batch.segments = [], lora_segments(row_slots, DEVICE)
    kernel_path = layer(x)
    assert_matches(kernel_path, torch_path.double().cpu(), torch.float32)
    assert not torch.equal(torch_path, base(x))


def test_the_engine_on_the_kernels_equals_the_merged_models(checkpoint, tmp_path):
    """The kernels in the real model's layers (q/k/v and gate/up parts at their offsets; on
    a CPU under the interpreter, on a GPU as they always run there): a batch mixing two
    adapters (ranks 8 and 16) and the base model gives transformers' greedy tokens with each
    adapter merged."""
    base = checkpoint("llama")
    loras, merged = [None], {None: str(base)}
    for i, rank in enumerate((8, 16), start=1):
        adapter = build_adapter(base, tmp_path / f"a{i}", rank, seed=i)
        merged[f"a{i}"] = str(merged_checkpoint(base, adapter, tmp_path / f"a{i}-merged"))
        loras.append(LoRARequest(f"a{i}", i, str(adapter)))
    engine = LLMEngine(
        EngineConfig(model=str(base), enable_lora=True, max_loras=2, num_kv_blocks=64)
    )
    engine.runner.lora.use_kernels = True  # already so on a GPU
    prompts = [[5 + 7 * i + j for j in range(9 + 4 * i)] for i in range(3)]
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(str(i), prompt, GREEDY, lora_request=lora)
    seen, tokens = JoinedOutputs(), {}
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            if out.finished:
                tokens[int(out.request_id)] = out.outputs[0].token_ids
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        reference = merged[None if lora is None else lora.lora_name]
        expected = hf_greedy(reference, prompt, GREEDY.max_tokens)
        if lora is not None:  # the adapter changes the tokens: the test can tell
            assert expected != hf_greedy(str(base), prompt, GREEDY.max_tokens)
        assert_greedy_match(reference, prompt, expected, tokens[i])
