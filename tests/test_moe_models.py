"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral; 8 experts, 2 per token) give
transformers' greedy tokens under the default settings and under chunked prefill with
preemption and prefix caching, every block accounted for; sharded over two ranks they
compute the logits of one; the routing and the grouped experts compute what their
definitions say; a misfit or quantized expert is refused, named."""

import math
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine_matches_transformers import MAX_TOKENS, make_prompts, run

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.cpu_linear.packed_linear import can_pack
from kvserve.engine.layers.moe.fused_moe import FusedMoE
from kvserve.engine.layers.moe.router import SoftmaxTopK
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.models import registry
from kvserve.engine.models.decoder import MLP
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.moe_block import SparseMoeBlock

from checkpoints import MOE_FAMILIES, build_checkpoint
from reference import assert_greedy_match, hf_greedy
from sharded_steps import DECODE_STEPS, on_two_ranks, run_steps

CPU = torch.device("cpu")


SCENARIOS = {
    "default-settings": dict(),
    "chunked-prefill-preemption-prefix-cache": dict(
        block_size=4, num_kv_blocks=40, max_num_batched_tokens=32, enable_prefix_caching=True
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_greedy_matches_transformers(checkpoint, family, scenario):
    path = str(checkpoint(family))
    engine = LLMEngine(EngineConfig(model=path, dtype="float32", **SCENARIOS[scenario]))
    pressured = scenario != "default-settings"
    prompts = make_prompts(seed=len(family), shared_prefixes=pressured)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = run(engine, prompts, params)  # audits every block after every step
    for prompt, got in zip(prompts, outputs, strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)
    if pressured:
        assert max(map(len, prompts)) > 32  # prompts longer than a step's budget: chunked
        assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0


def test_qwen2_moe_without_qkv_bias_loads_no_bias_and_matches_transformers(tmp_path):
    """``qkv_bias: false`` builds q/k/v without biases (the checkpoint has none to load)."""
    fields = dict(MOE_FAMILIES["qwen2_moe"][1], qkv_bias=False)
    path = str(build_checkpoint("qwen2_moe", tmp_path / "q", **fields))
    assert not any(name.endswith("_proj.bias") for name in load_file(f"{path}/model.safetensors"))
    model = load(path)
    assert all(layer.self_attn.qkv_proj.bias is None for layer in model.layers)
    engine = LLMEngine(
        EngineConfig(
            model=path, dtype="float32", **SCENARIOS["chunked-prefill-preemption-prefix-cache"]
        )
    )
    prompts = make_prompts(seed=3, shared_prefixes=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for prompt, got in zip(prompts, run(engine, prompts, params), strict=True):
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, MAX_TOKENS), got)


def test_each_layer_gets_the_mlp_its_config_says(checkpoint):
    """qwen3_moe: layer 1 in mlp_only_layers; qwen3_moe-norm-topk: decoder_sparse_step 2,
    layers 1 and 3 sparse; qwen2_moe: a shared expert; Mixtral: renormalised top-k."""
    kinds = {}
    for name in MOE_FAMILIES:
        path = checkpoint(name)
        cfg = ModelConfig.from_dir(path)
        model = load_model(path, cfg, TorchAttention(), 64, torch.float32, CPU)
        kinds[name] = [type(layer.mlp) for layer in model.layers]
        if name == "qwen2_moe":
            assert all(isinstance(layer.mlp.shared_expert, MLP) for layer in model.layers)
        if name == "mixtral":
            assert model.layers[0].mlp.routing == SoftmaxTopK(top_k=2, renormalize=True)
    moe, dense = SparseMoeBlock, MLP
    assert kinds == {
        "qwen3_moe": [moe, dense, moe],
        "qwen3_moe-norm-topk": [dense, moe, dense, moe],
        "qwen2_moe": [moe, moe],
        "mixtral": [moe, moe],
    }


def test_softmax_top_k_keeps_the_largest_probabilities_renormalised_or_not():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 3.0, 2.0]]).log()  # probs: /10
    weights, ids = SoftmaxTopK(top_k=2, renormalize=False)(logits)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.tolist() == [[3, 2], [0, 2]]
    torch.testing.assert_close(weights, torch.tensor([[0.4, 0.3], [0.4, 0.3]]))
    weights, ids = SoftmaxTopK(top_k=2, renormalize=True)(logits.bfloat16())
    assert ids.tolist() == [[3, 2], [0, 2]] and weights.dtype == torch.float32
    torch.testing.assert_close(weights, torch.tensor([[4 / 7, 3 / 7]] * 2), rtol=0.02, atol=0)


def experts_by_definition(x, w13, w2, weights, ids) -> torch.Tensor:
    """Token by token, pair by pair: ``sum_k weights[t, k] * expert_{ids[t, k]}(x_t)``."""
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            gate, up = (w13[e] @ x[t]).split(inter)
            out[t] += weight * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("kernels", ["torch", "cpu-packed"])
def test_grouped_experts_compute_the_definition_running_only_experts_with_tokens(
    kernels, monkeypatch
):
    torch.manual_seed(0)
    layer = FusedMoE(num_experts=8, hidden_size=48, intermediate_size=40, tp=TensorParallel())
    with torch.no_grad():
        layer.w13.normal_(0, 0.2)
        layer.w2.normal_(0, 0.2)
    w13, w2 = layer.w13.clone(), layer.w2.clone()
    if kernels == "cpu-packed" and not can_pack(torch.float32, CPU):
        pytest.skip("no packed float32 linears on this CPU")
    layer.process_weights_after_loading(kernels)
    x = torch.randn(13, 48)
    ids = torch.tensor([[(3 * t) % 5, 6 if t % 2 else 1] for t in range(13)], dtype=torch.int32)
    weights = torch.rand(13, 2)
    ran: list[int] = []
    expert = FusedMoE.expert
    monkeypatch.setattr(FusedMoE, "expert", lambda m, e, rows: ran.append(e) or expert(m, e, rows))
    got = layer(x, weights, ids)
    assert ran == [0, 1, 2, 3, 4, 6]  # 5 and 7 have no tokens
    torch.testing.assert_close(got, experts_by_definition(x, w13, w2, weights, ids))


def rewrite(path, name: str, tensor: torch.Tensor | None) -> None:
    """Checkpoint tensor ``name`` replaced by ``tensor`` (None: removed)."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    if tensor is None:
        del tensors[name]
    else:
        tensors[name] = tensor
    save_file(tensors, file, metadata={"format": "pt"})


def load(path, **kwargs):
    cfg = ModelConfig.from_dir(path, **kwargs)
    return load_model(path, cfg, TorchAttention(), 64, torch.float32, CPU)


def test_a_misfit_expert_tensor_is_named(tmp_path):
    path = build_checkpoint("mixtral", tmp_path / "m", **MOE_FAMILIES["mixtral"][1])
    name = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
    rewrite(path, name, torch.zeros(40, 64))
    with pytest.raises(ValueError) as err:
        load(path)
    assert str(err.value).startswith(
        f"checkpoint tensor {name!r} (shape [40, 64]) does not fit layers.1.mlp.experts.w13 "
        "(this rank's part: [8, 64, 64]): expert 5's w3 must have shape [32, 64] "
        "(hidden_size, intermediate_size), not [40, 64]"
    )


def test_a_missing_or_extra_expert_is_named(tmp_path):
    path = build_checkpoint("qwen2_moe", tmp_path / "q", **MOE_FAMILIES["qwen2_moe"][1])
    rewrite(path, "model.layers.0.mlp.experts.7.down_proj.weight", None)
    with pytest.raises(ValueError, match=r"lacks weights for: layers\.0\.mlp\.experts\.w2$"):
        load(path)
    rewrite(path, "model.layers.0.mlp.experts.8.down_proj.weight", torch.zeros(64, 32))
    with pytest.raises(ValueError, match=r"unexpected weight 'model\.layers\.0\.mlp\.experts\.8"):
        load(path)


def test_quantized_experts_are_refused_naming_the_layer(checkpoint):
    with pytest.raises(ValueError) as err:
        load(checkpoint("qwen3_moe"), quantization="fp8")
    assert str(err.value).startswith(
        "model.layers.0.mlp.experts are quantized (fp8 per-channel, activations fp8 dynamic "
        "(fp8)); mixture-of-experts layers run 16-bit experts only"
    )


def test_a_moe_architecture_without_experts_is_refused():
    cfg = ModelConfig.from_dict(
        dict(
            architectures=["MixtralForCausalLM"], vocab_size=64, hidden_size=32,
            intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="names no experts"), torch.device("meta"):
        registry.model_class(cfg.architecture)(cfg, TorchAttention(), 64)


@pytest.mark.parametrize(
    ("architecture", "fields", "message"),
    [
        (
            "MixtralForCausalLM",
            dict(num_local_experts=4, intermediate_size=33),
            "intermediate_size",
        ),
        (
            "Qwen3MoeForCausalLM",
            dict(num_experts=4, moe_intermediate_size=33),
            "moe_intermediate_size",
        ),
        (
            "Qwen2MoeForCausalLM",
            dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=33),
            "shared_expert_intermediate_size",
        ),
    ],
)
def test_experts_that_two_ranks_cannot_split_are_named(architecture, fields, message):
    raw = dict(
        architectures=[architecture], vocab_size=64, hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_experts_per_tok=2,
    )  # fmt: skip
    cfg = ModelConfig.from_dict({**raw, **fields})
    tp = TensorParallel(rank=0, size=2, group=object())  # never used: the build fails first
    pattern = rf"^{message} \(33\) cannot be split evenly over 2 tensor-parallel ranks$"
    with pytest.raises(ValueError, match=pattern), torch.device("meta"):
        registry.model_class(architecture)(cfg, TorchAttention(), 64, tp)


def expert_shapes(path, tp: TensorParallel) -> dict[str, tuple[int, ...]]:
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, CPU, tp=tp)
    return {n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith("layers.0.mlp")}


def rank_results(path, tp: TensorParallel) -> dict:
    reduce = TensorParallel.all_reduce
    with mock.patch.object(TensorParallel, "all_reduce", autospec=True, side_effect=reduce) as m:
        logits = run_steps(path, tp)
    return {"logits": logits, "all_reduces": m.call_count, "shapes": expert_shapes(path, tp)}


TP_CASES = ("qwen3_moe", "qwen2_moe", "mixtral")


@pytest.fixture(scope="module")
def two_ranks(checkpoint, tmp_path_factory):
    paths = {name: checkpoint(name) for name in TP_CASES}
    ranks = on_two_ranks(rank_results, list(paths.values()), tmp_path_factory.mktemp("tp"))
    return paths, [{name: rank[paths[name].name] for name in TP_CASES} for rank in ranks]


@pytest.mark.parametrize("case", TP_CASES)
def test_two_ranks_compute_the_logits_of_one(two_ranks, case):
    paths, ranks = two_ranks
    expected = run_steps(paths[case], TensorParallel())
    got = ranks[0][case]["logits"]
    assert len(got) == len(expected)
    for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        assert torch.equal(ours, ranks[1][case]["logits"][step])


def test_each_rank_holds_half_of_every_experts_intermediate_features(two_ranks):
    """hidden 64, 8 experts of 32 intermediate features (Mixtral: intermediate_size 32),
    Qwen2-MoE's shared expert of 48: 16 and 24 per rank; the router whole on each."""
    _, ranks = two_ranks
    for rank in ranks:
        assert rank["qwen2_moe"]["shapes"] == {
            "layers.0.mlp.gate.weight": (8, 64),
            "layers.0.mlp.experts.w13": (8, 2 * 16, 64),
            "layers.0.mlp.experts.w2": (8, 64, 16),
            "layers.0.mlp.shared_expert.gate_up_proj.weight": (2 * 24, 64),
            "layers.0.mlp.shared_expert.down_proj.weight": (64, 24),
            "layers.0.mlp.shared_expert_gate.weight": (1, 64),
        }
        shapes = rank["mixtral"]["shapes"]
        assert shapes["layers.0.mlp.experts.w13"] == (8, 32, 64)
        assert math.prod(shapes["layers.0.mlp.experts.w2"]) == 8 * 64 * 16


def test_an_moe_block_reduces_once_as_a_dense_mlp_does(two_ranks):
    """Per forward: the embedding's all-reduce, then each layer's attention output and its
    MoE block's (experts and shared expert together): Qwen2-MoE's 2 layers, 5 a step."""
    _, ranks = two_ranks
    for rank in ranks:
        assert rank["qwen2_moe"]["all_reduces"] == (DECODE_STEPS + 1) * (1 + 2 * 2)
        assert rank["qwen3_moe"]["all_reduces"] == (DECODE_STEPS + 1) * (1 + 2 * 3)
