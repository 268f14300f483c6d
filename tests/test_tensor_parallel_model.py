"""A model sharded over two ranks (two processes, gloo on 127.0.0.1) computes the logits of the
unsharded model, each rank holding and reading only its shard of the checkpoint; a shape
that cannot be split fails, naming it."""

from pathlib import Path

import pytest
import torch

from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models import registry
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig

from checkpoints import build_checkpoint
from sharded_steps import on_two_ranks, run_steps

# (family, config overrides): the three families' shapes, one kv head replicated over the
# ranks (and tied embeddings), and a vocabulary that 2 does not divide (padded per rank)
CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "llama-one-kv-head": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen2-odd-vocab": ("qwen2", dict(vocab_size=511)),
}


def shard_shapes(path: Path, tp: TensorParallel) -> dict[str, tuple[int, ...]]:
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, torch.device("cpu"), tp=tp)
    return {name: tuple(p.shape) for name, p in model.named_parameters() if "layers.1" not in name}


def rank_results(path: Path, tp: TensorParallel) -> dict:
    return {"logits": run_steps(path, tp), "shapes": shard_shapes(path, tp)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every case's checkpoint, and what each of two ranks computed from it."""
    root = tmp_path_factory.mktemp("tp")
    paths = {
        name: build_checkpoint(family, root / name, seed=1, **overrides)
        for name, (family, overrides) in CASES.items()
    }
    return paths, on_two_ranks(rank_results, list(paths.values()), root)


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_compute_the_logits_of_one(two_ranks, case):
    paths, ranks = two_ranks
    expected = run_steps(paths[case], TensorParallel())
    got = ranks[0][case]["logits"]
    assert [t.shape for t in got] == [t.shape for t in expected]
    assert got[0].shape[-1] == CASES[case][1].get("vocab_size", 512)  # the padding trimmed
    for step, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        assert torch.equal(ours, ranks[1][case]["logits"][step])  # every rank has them all


def test_each_rank_holds_only_its_shard(two_ranks):
    """hidden 64, 4 query heads and 2 kv heads of 16 dims, MLP 128, vocabulary 512."""
    _, ranks = two_ranks
    for rank in ranks:
        assert rank["llama"]["shapes"] == {
            "embed_tokens.weight": (256, 64),
            "layers.0.input_layernorm.weight": (64,),
            "layers.0.self_attn.qkv_proj.weight": (2 * 16 + 2 * 16, 64),  # 2 q heads, 1 kv head
            "layers.0.self_attn.o_proj.weight": (64, 32),
            "layers.0.self_attn.k_scale": (),  # an FP8 KV cache's scales: every rank's
            "layers.0.self_attn.v_scale": (),
            "layers.0.post_attention_layernorm.weight": (64,),
            "layers.0.mlp.gate_up_proj.weight": (2 * 64, 64),
            "layers.0.mlp.down_proj.weight": (64, 64),
            "norm.weight": (64,),
            "lm_head.weight": (256, 64),
        }
        qwen2 = rank["qwen2-odd-vocab"]["shapes"]
        assert qwen2["layers.0.self_attn.qkv_proj.bias"] == (64,)
        assert qwen2["embed_tokens.weight"] == qwen2["lm_head.weight"] == (256, 64)  # 511 + 1
        assert rank["qwen3"]["shapes"]["layers.0.self_attn.q_norm.weight"] == (128,)  # head_dim
        # one kv head: each rank holds it (and 2 of the 4 query heads)
        one_kv = rank["llama-one-kv-head"]["shapes"]["layers.0.self_attn.qkv_proj.weight"]
        assert one_kv == (2 * 16 + 2 * 16, 64)


def model_config(**fields) -> ModelConfig:
    raw = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=512,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return ModelConfig.from_dict({**raw, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(num_attention_heads=3, num_key_value_heads=1),
            r"^query heads \(3\) cannot be split evenly over 2 tensor-parallel ranks$",
        ),
        (
            dict(num_attention_heads=6, num_key_value_heads=3),
            r"^3 kv heads cannot be split over 2 ranks",
        ),
        (
            dict(intermediate_size=97),
            r"^intermediate_size \(97\) cannot be split evenly over 2 tensor-parallel ranks$",
        ),
    ],
)
def test_a_shape_that_cannot_be_split_is_named(fields, message):
    cfg = model_config(**fields)
    tp = TensorParallel(rank=0, size=2, group=object())  # never used: the build fails first
    with pytest.raises(ValueError, match=message), torch.device("meta"):
        registry.model_class(cfg.architecture)(cfg, TorchAttention(), 64, tp)
