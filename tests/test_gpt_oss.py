"""gpt-oss (sinks, alternating 8-token sliding-window and full layers, YaRN, top-k-then-
softmax routing, biased experts with the clamped SwiGLU) gives transformers' greedy tokens
under the default settings and under chunked prefill with preemption and prefix caching,
from its stacked dense experts and from MXFP4 ones; sharded over two ranks it computes the
logits of one; its per-layer windows do not cap the context; misfits are named."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.layers.activation import swigluoai_and_mul
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.moe.router import TopKSoftmax
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig

from gpt_oss_checkpoints import WINDOW, build_gpt_oss, write_mxfp4
from reference import assert_greedy_match, hf_greedy
from sharded_steps import on_two_ranks, run_steps

CPU = torch.device("cpu")
SCENARIOS = {
    "default-settings": dict(),
    "chunked-prefill-preemption-prefix-cache": dict(
        block_size=4, num_kv_blocks=40, max_num_batched_tokens=32, enable_prefix_caching=True
    ),
}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return build_gpt_oss(tmp_path_factory.mktemp("gpt-oss"))


@pytest.fixture(scope="module")
def mxfp4(dense, tmp_path_factory):
    return write_mxfp4(dense, tmp_path_factory.mktemp("mxfp4") / "gpt-oss-mxfp4")


def greedy_matches(path, reference, scenario: str, seed: int) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", **SCENARIOS[scenario]))
    prompts = make_prompts(seed=seed, shared_prefixes=scenario != "default-settings")
    assert max(map(len, prompts)) > WINDOW
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every block after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        expected = hf_greedy(str(reference), prompt, MAX_TOKENS)
        assert_greedy_match(str(reference), prompt, expected, got)
    return engine


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_matches_transformers(dense, scenario):
    engine = greedy_matches(dense, dense, scenario, seed=44)
    if scenario != "default-settings":
        assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0


def test_mxfp4_experts_give_transformers_tokens_on_their_dequantized_weights(mxfp4):
    greedy_matches(mxfp4.path, mxfp4.reference, "default-settings", seed=45)


def test_mxfp4_checkpoint_is_in_the_real_layout(mxfp4):
    tensors = load_file(mxfp4.path / "model.safetensors")
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items() if ".0.mlp.experts" in n}
    assert shapes == {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ((8, 64, 2, 16), torch.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ((8, 64, 2), torch.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_bias": ((8, 64), torch.float32),
        "model.layers.0.mlp.experts.down_proj_blocks": ((8, 64, 1, 16), torch.uint8),
        "model.layers.0.mlp.experts.down_proj_scales": ((8, 64, 1), torch.uint8),
        "model.layers.0.mlp.experts.down_proj_bias": ((8, 64), torch.float32),
    }
    quant = ModelConfig.from_dir(mxfp4.path).quantization
    assert quant is not None and quant.describe() == "mxfp4 experts, linear layers 16-bit (mxfp4)"


def test_windows_live_in_the_layers_and_do_not_cap_the_context(dense):
    cfg = ModelConfig.from_dir(dense)
    assert (cfg.layer_windows, cfg.sliding_window) == ((WINDOW, None), None)
    model = load_model(dense, cfg, TorchAttention(), 64, torch.float32, CPU)
    attention = [layer.self_attn for layer in model.layers]
    assert [a.sliding_window for a in attention] == [WINDOW, None]
    assert all(a.sinks is not None and a.sinks.shape == (4,) for a in attention)
    engine = LLMEngine(EngineConfig(model=str(dense), dtype="float32", num_kv_blocks=8))
    assert engine.max_model_len == 2048


def shapes_and_logits(path, tp: TensorParallel) -> dict:
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, CPU, tp=tp)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith("layers.0.")}
    return {"logits": run_steps(path, tp), "shapes": shapes}


@pytest.fixture(scope="module")
def two_ranks(dense, mxfp4, tmp_path_factory):
    paths = [dense, mxfp4.path]
    ranks = on_two_ranks(shapes_and_logits, paths, tmp_path_factory.mktemp("tp"))
    return {path: [rank[path.name] for rank in ranks] for path in paths}


@pytest.mark.parametrize("which", ["dense", "mxfp4"])
def test_two_ranks_compute_the_logits_of_one(two_ranks, dense, mxfp4, which):
    path = dense if which == "dense" else mxfp4.path
    expected = run_steps(path, TensorParallel())  # prompts of 7 tokens, then 3 more: > WINDOW
    ranks = two_ranks[path]
    for step, theirs in enumerate(expected):
        torch.testing.assert_close(ranks[0]["logits"][step], theirs, rtol=1e-5, atol=1e-5)
        assert torch.equal(ranks[0]["logits"][step], ranks[1]["logits"][step])


def test_each_rank_holds_half_of_the_heads_sinks_and_expert_features(two_ranks, dense):
    for rank in two_ranks[dense]:
        shapes = rank["shapes"]
        assert shapes["layers.0.self_attn.sinks"] == (2,)
        assert shapes["layers.0.mlp.router.weight"] == (8, 64)
        assert shapes["layers.0.mlp.experts.w13"] == (8, 2 * 16, 64)
        assert shapes["layers.0.mlp.experts.w13_bias"] == (8, 2 * 16)
        assert shapes["layers.0.mlp.experts.w2"] == (8, 64, 16)
        assert shapes["layers.0.mlp.experts.w2_bias"] == (8, 64)


def test_routing_is_top_k_of_the_logits_then_softmax_over_them():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, -1.0, 4.0, 0.0]])
    weights, ids = TopKSoftmax(top_k=2)(logits)
    assert ids.tolist() == [[1, 3], [0, 2]] and ids.dtype == torch.int32
    torch.testing.assert_close(weights, torch.softmax(torch.tensor([[3.0, 2.0], [5.0, 4.0]]), -1))


def test_clamped_swiglu_is_gpt_oss_activation():
    gate = torch.tensor([-9.0, -1.0, 0.5, 7.5])
    up = torch.tensor([-8.0, 0.0, 2.0, 9.0])
    got = swigluoai_and_mul(torch.cat([gate, up]))
    clamped_gate, clamped_up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    expected = (clamped_up + 1) * clamped_gate * torch.sigmoid(1.702 * clamped_gate)
    torch.testing.assert_close(got, expected)


def rewrite_config(path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"layer_types": ["sliding_attention"]},
            "layer_types must list one of ('full_attention', 'sliding_attention') for each of "
            "the 2 layers (num_hidden_layers), got ['sliding_attention']",
        ),
        (
            {"layer_types": ["chunked_attention", "full_attention"]},
            "unsupported layer_types ['chunked_attention']; supported: "
            "('full_attention', 'sliding_attention')",
        ),
        ({"swiglu_limit": 10.0}, "unsupported swiglu_limit 10.0; gpt-oss's experts use 7.0"),
    ],
)
def test_unsupported_config_is_named(dense, tmp_path, changes, message):
    path = tmp_path / "bad"
    path.mkdir()
    (path / "config.json").write_text((dense / "config.json").read_text())
    rewrite_config(path, **changes)
    with pytest.raises(ValueError) as err:
        ModelConfig.from_dir(path)
    assert str(err.value) == message


def test_a_misfit_stacked_expert_tensor_is_named(dense, tmp_path):
    path = build_gpt_oss(tmp_path / "misfit")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.experts.gate_up_proj"
    tensors[name] = torch.zeros(8, 64, 48)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_model(path, ModelConfig.from_dir(path), TorchAttention(), 64, torch.float32, CPU)
    assert str(err.value) == (
        f"checkpoint tensor {name!r} (shape [8, 64, 48]) does not fit layers.1.mlp.experts.w13 "
        "(this rank's part: [8, 64, 64]): the experts' w13 must have shape [8, 64, 64] "
        "(num_local_experts, hidden_size, intermediate_size as stacked), not [8, 64, 48]"
    )
