"""A flat batch of a few prompts run step by step through a model loaded by
``load_model``, on one rank or on two (two processes, gloo on 127.0.0.1): the logits of
every step, for comparing a sharded or quantized model against another."""

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.cpu_linear.packed_linear import can_pack
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig

BLOCK_SIZE = 4
MAX_BLOCKS = 8  # per sequence
PROMPTS = [[5, 9, 33, 70, 12, 8, 400], [100, 200, 300, 510]]
DECODE_STEPS = 3


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


def layer_metas(
    cfg: ModelConfig, step: AttentionMetadata
) -> list[AttentionMetadata | StateMetadata]:
    """``step`` for each attention layer, its ``StateMetadata`` for each linear-attention
    one (sequence i in slot i, with a state once it has a context)."""
    num_seqs = len(step.query_lens_host)
    state = StateMetadata(
        query_start_loc=step.query_start_loc,
        state_slots=torch.arange(num_seqs, dtype=torch.int32),
        has_initial_state=torch.tensor(
            [s > q for s, q in zip(step.seq_lens_host, step.query_lens_host, strict=True)]
        ),
        query_start_loc_host=step.query_start_loc.tolist(),
    )
    return [state if i in cfg.linear_layers else step for i in range(cfg.num_layers)]


@torch.inference_mode()
def run_steps(
    path: Path,
    tp: TensorParallel,
    backend: AttentionBackend | None = None,
    prompts: list[list[int]] = PROMPTS,
) -> list[torch.Tensor]:
    """The logits of a prefill of ``prompts`` and DECODE_STEPS greedy decode steps, in
    float32 through ``backend`` (default: torch's attention and the CPU's packed linears);
    a linear-attention layer keeps sequence i's state in slot i."""
    cfg = ModelConfig.from_dir(path)
    cpu = torch.device("cpu")
    packed = can_pack(torch.float32, cpu)
    backend = backend or TorchAttention()
    model = load_model(path, cfg, backend, 64, torch.float32, cpu, packed=packed, tp=tp)
    shape = (len(prompts) * MAX_BLOCKS, BLOCK_SIZE, tp.kv_heads(cfg.num_kv_heads), cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    if cfg.gated_delta_net is not None:
        spec = cfg.gated_delta_net.state_spec(tp.size, torch.float32)
        for layer in cfg.linear_layers:
            caches[layer] = spec.allocate(len(prompts), cpu)
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    step = meta([0] * len(prompts), [len(p) for p in prompts])
    last = step.query_start_loc[1:].long() - 1
    out = []
    for _ in range(DECODE_STEPS + 1):
        logits = model.logits(model(ids, positions, caches, layer_metas(cfg, step), last))
        out.append(logits)
        context = step.seq_lens_host
        ids, positions = logits.argmax(-1), torch.tensor(context)
        step, last = meta(context, [1] * len(prompts)), None
    return out


def _rank_main(
    rank: int, size: int, port: int, compute: Callable[[Path, TensorParallel], Any],
    paths: list[Path], out: Path,
) -> None:  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    try:
        tp = TensorParallel(rank, size, dist.group.WORLD)
        torch.save({path.name: compute(path, tp) for path in paths}, out / f"rank{rank}.pt")
        # neither rank tears the group down while the other may still be in its last
        # collective (a CI run saw rank 1 abort in gloo at teardown, once)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def on_two_ranks(
    compute: Callable[[Path, TensorParallel], Any], paths: list[Path], out: Path
) -> list[dict[str, Any]]:
    """``compute(path, tp)`` for every checkpoint in ``paths``, on each of two ranks (two
    processes, gloo on 127.0.0.1; ``compute`` must be a module-level function), as
    ``[rank 0's {path name: result}, rank 1's]``."""
    args = (2, free_port(), compute, paths, out)
    mp.spawn(_rank_main, args=args, nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
