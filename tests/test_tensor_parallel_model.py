"""A model sharded over two ranks (two processes, gloo on 127.0.0.1) computes the logits of the
unsharded model, each rank holding and reading only its shard of the checkpoint; a shape
that cannot be split fails, naming it."""

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.cpu_linear.packed_linear import can_pack
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models import registry
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig

from checkpoints import build_checkpoint

BLOCK_SIZE = 4
MAX_BLOCKS = 8  # per sequence
PROMPTS = [[5, 9, 33, 70, 12, 8, 400], [100, 200, 300, 510]]
DECODE_STEPS = 3
# (family, config overrides): the three families' shapes, one kv head replicated over the
# ranks (and tied embeddings), and a vocabulary that 2 does not divide (padded per rank)
CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "llama-one-kv-head": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen2-odd-vocab": ("qwen2", dict(vocab_size=511)),
}


def meta(context: list[int], new: list[int]) -> AttentionMetadata:
    """The step of ``new[i]`` tokens after ``context[i]`` cached ones of sequence i, whose
    blocks are ``i * MAX_BLOCKS ...``."""
    seq_lens = [c + n for c, n in zip(context, new, strict=True)]
    slots = [
        (i * MAX_BLOCKS) * BLOCK_SIZE + pos
        for i, (c, s) in enumerate(zip(context, seq_lens, strict=True))
        for pos in range(c, s)
    ]
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    tables = [[i * MAX_BLOCKS + b for b in range(MAX_BLOCKS)] for i in range(len(new))]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        query_lens_host=list(new),
        seq_lens_host=seq_lens,
        max_query_len=max(new),
        max_seq_len=max(seq_lens),
    )


@torch.inference_mode()
def run_steps(path: Path, tp: TensorParallel) -> list[torch.Tensor]:
    """The logits of a prefill of PROMPTS and DECODE_STEPS greedy decode steps."""
    cfg = ModelConfig.from_dir(path)
    cpu = torch.device("cpu")
    packed = can_pack(torch.float32, cpu)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, cpu, packed=packed, tp=tp)
    shape = (len(PROMPTS) * MAX_BLOCKS, BLOCK_SIZE, tp.kv_heads(cfg.num_kv_heads), cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    ids = torch.tensor([t for p in PROMPTS for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in PROMPTS])
    step = meta([0] * len(PROMPTS), [len(p) for p in PROMPTS])
    last = step.query_start_loc[1:].long() - 1
    out = []
    for _ in range(DECODE_STEPS + 1):
        logits = model.logits(model(ids, positions, caches, step, last))
        out.append(logits)
        context = step.seq_lens_host
        ids, positions = logits.argmax(-1), torch.tensor(context)
        step, last = meta(context, [1] * len(PROMPTS)), None
    return out


def shard_shapes(path: Path, tp: TensorParallel) -> dict[str, tuple[int, ...]]:
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, TorchAttention(), 64, torch.float32, torch.device("cpu"), tp=tp)
    return {name: tuple(p.shape) for name, p in model.named_parameters() if "layers.1" not in name}


def rank_main(rank: int, size: int, port: int, paths: list[Path], out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    try:
        tp = TensorParallel(rank, size, dist.group.WORLD)
        results = {
            path.name: {"logits": run_steps(path, tp), "shapes": shard_shapes(path, tp)}
            for path in paths
        }
        torch.save(results, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every case's checkpoint, and what each of two ranks computed from it."""
    root = tmp_path_factory.mktemp("tp")
    paths = {
        name: build_checkpoint(family, root / name, seed=1, **overrides)
        for name, (family, overrides) in CASES.items()
    }
    mp.spawn(rank_main, args=(2, free_port(), list(paths.values()), root), nprocs=2, join=True)
    ranks = [torch.load(root / f"rank{r}.pt") for r in range(2)]
    return paths, ranks


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
