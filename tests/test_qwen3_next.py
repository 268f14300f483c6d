"""Qwen3-Next gives transformers' greedy tokens in float32, under the default settings and
under chunked prefill (13-token chunks, which split the delta rule's 64-token chunks) with
preemption, prompts of 1 to 200 tokens, the audit of blocks and state slots after every
step, and on the Triton kernels (interpreted). Its plan gives the linear-attention layers
state slots, not blocks, whose memory comes off the KV budget; the runner hands those layers
each request's slot; the memory profiling step runs them. Two ranks (gloo) compute the
logits of one, for Qwen3-Next and Qwen3.5-MoE."""

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.execution_plan import plan_execution
from kvserve.engine.kernels import cpu_library
from kvserve.engine.kv_cache_sizing import profile_query_lens, profile_step
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.model_config import ModelConfig

from hybrid_checkpoints import build_qwen3_5, build_qwen3_next
from reference import assert_greedy_match, hf_greedy
from sharded_steps import DECODE_STEPS, on_two_ranks, run_steps

SCENARIOS = {
    "default-settings": dict(),
    "chunked-prefill-preemption": dict(
        block_size=4, num_kv_blocks=24, max_num_batched_tokens=13, enable_prefix_caching=True
    ),
}


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    return build_qwen3_next(tmp_path_factory.mktemp("qwen3-next"))


def greedy_matches(
    path, settings: dict, prompts: list[list[int]], max_tokens: int = MAX_TOKENS
) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", **settings))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits blocks and slots after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(str(path), prompt, hf_greedy(str(path), prompt, max_tokens), got)
    return engine


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.usefixtures("scheduling")
def test_greedy_matches_transformers(qwen3_next, scenario):
    prompts = make_prompts(seed=52, shared_prefixes=scenario != "default-settings")
    engine = greedy_matches(qwen3_next, SCENARIOS[scenario], prompts)
    assert [(g.kind, g.layers) for g in engine.kv.groups] == [("full_attention", (1,))]
    assert not engine.kv.enable_prefix_caching  # the state after a prefix is not kept
    if scenario != "default-settings":
        assert engine.stats.num_preemptions > 0


def test_prompts_of_1_to_200_tokens_match_transformers_in_chunks_that_split_delta_chunks(
    qwen3_next,
):
    settings = SCENARIOS["chunked-prefill-preemption"] | {"num_kv_blocks": 120}
    rng = random.Random(53)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 2, 9, 64, 77, 200)]
    greedy_matches(qwen3_next, settings, prompts)
    greedy_matches(qwen3_next, {}, prompts)


def test_the_plan_gives_each_sequence_a_state_slot(qwen3_next):
    cfg = ModelConfig.from_dir(qwen3_next)
    assert (cfg.linear_layers, cfg.rope.partial_rotary_factor) == ((0, 2), 0.25)
    engine = LLMEngine(EngineConfig(model=str(qwen3_next), dtype="float32", max_num_seqs=3))
    # per layer: conv state (2*16 + 32 channels x 3 taps) x 4 bytes + ssm state 4x8x8 x 4
    slot_bytes = 2 * (64 * 3 * 4 + 4 * 8 * 8 * 4)
    assert (engine.plan.num_state_slots, engine.plan.state_slot_bytes) == (3, slot_bytes)
    assert f"3 state slots x {slot_bytes} bytes" in str(engine.plan)
    # recorded CPU decode steps copy the state slots into static buffers; a CUDA graph's
    # padding rows would need a scratch slot: none on CUDA
    assert engine.plan.cpu_graphs == cpu_library.available()
    on_cuda = plan_execution(EngineConfig(model=str(qwen3_next), device="cuda"), cfg)
    assert (on_cuda.backend.name, on_cuda.cuda_graphs) == ("triton", False)
    assert engine.kv.slots is not None and engine.kv.slots.num_slots == 3
    states = [engine.runner.kv_caches[i] for i in (0, 2)]
    assert [tuple(t.shape) for t in states[0]] == [(3, 64, 3), (3, 4, 8, 8)]


def test_the_state_slots_come_off_a_kv_budget(qwen3_next):
    budget = 0.001  # GiB
    engine = LLMEngine(
        EngineConfig(model=str(qwen3_next), dtype="float32", kv_cache_memory_gb=budget)
    )
    plan = engine.plan
    slots = plan.num_state_slots * plan.state_slot_bytes
    assert slots > 0
    assert plan.num_kv_blocks == (int(budget * 2**30) - slots) // plan.kv_block_bytes


def test_the_memory_profiling_step_runs_the_linear_attention_layers(qwen3_next):
    engine = LLMEngine(EngineConfig(model=str(qwen3_next), dtype="float32"))
    lens = profile_query_lens(64, 3, 512)
    logits = profile_step(engine.runner.model, lens, 16, torch.float32, torch.device("cpu"))
    assert logits.shape == (3, 512) and logits.isfinite().all()


def test_the_runner_gives_the_linear_layers_each_request_s_slot(qwen3_next):
    engine = LLMEngine(EngineConfig(model=str(qwen3_next), dtype="float32", max_num_seqs=3))
    out = SchedulerOutput()
    for slot, computed, scheduled in ((2, 0, 5), (0, 4, 1)):  # a new prompt; a decode
        request = Request(str(slot), [3, 4, 5, 6, 7], SamplingParams(max_tokens=1))
        request.block_tables, request.num_skipped_blocks = [[slot]], [0]
        request.state_slot, request.num_computed_tokens = slot, computed
        out.add(request, scheduled)
    metas = engine.runner.prepare(out).meta
    assert isinstance(metas, list) and isinstance(metas[1], AttentionMetadata)
    state = metas[0]
    assert isinstance(state, StateMetadata) and metas[2] is state
    assert state.state_slots.tolist() == [2, 0]
    assert state.has_initial_state.tolist() == [False, True]
    assert state.query_start_loc_host == [0, 5, 6] == state.query_start_loc.tolist()


def test_two_ranks_compute_the_logits_of_one(qwen3_next, tmp_path_factory):
    qwen3_5_moe = build_qwen3_5(tmp_path_factory.mktemp("qwen3_5_moe-tp"), "qwen3_5_moe_text")
    paths = [qwen3_next, qwen3_5_moe]
    ranks = on_two_ranks(run_steps, paths, tmp_path_factory.mktemp("tp"))
    for path in paths:
        expected = run_steps(path, TensorParallel())
        got = ranks[0][path.name]
        assert len(got) == len(expected) == DECODE_STEPS + 1
        for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}")
            assert torch.equal(ours, ranks[1][path.name][step])


def test_the_triton_kernels_give_transformers_tokens(qwen3_next):
    """Triton attention and the Triton delta-rule and convolution kernels (interpreted on a
    CPU): a prompt that crosses a 64-token chunk in chunks of 32, next to short ones and
    their decodes."""
    settings = dict(attention_backend="triton", block_size=4, max_num_batched_tokens=32)
    rng = random.Random(56)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (70, 5, 1)]
    greedy_matches(qwen3_next, settings, prompts, max_tokens=6)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layer_types": ["linear_attention", "mamba"]}, "layer_types must list one of"),
        ({"linear_conv_kernel_dim": None}, "lacks linear_conv_kernel_dim"),
        ({"rope_parameters": {"partial_rotary_factor": 1.5}}, "partial_rotary_factor must be"),
    ],
)
def test_a_bad_config_is_named(qwen3_next, fields, message):
    raw = json.loads((qwen3_next / "config.json").read_text())
    raw.update({k: v for k, v in fields.items() if v is not None})
    for name in [k for k, v in fields.items() if v is None]:
        del raw[name]
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw)


def test_the_multi_token_prediction_layer_is_not_loaded(qwen3_next, tmp_path):
    path = tmp_path / "with-mtp"
    shutil.copytree(qwen3_next, path)
    weights = load_file(path / "model.safetensors")
    weights["mtp.fc.weight"] = torch.ones(64, 128)
    save_file(weights, path / "model.safetensors", {"format": "pt"})
    greedy_matches(path, {}, [[7, 8, 9]], max_tokens=4)
