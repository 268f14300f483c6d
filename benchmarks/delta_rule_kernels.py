"""The Gated DeltaNet's Triton kernels timed on a GPU at Qwen3.5-9B's linear-attention
shape, each against the bytes it must move.

    python benchmarks/delta_rule_kernels.py [--out FILE]
    python benchmarks/delta_rule_kernels.py --dry-run     # any machine: shapes, checks, no timing

The shape is ``Qwen3_5TextConfig()``'s defaults (Qwen3.5-9B's text model: 16 key heads and
32 value heads of 128, a 4-tap convolution over 8192 channels; 24 of its 32 layers are
linear attention). Decode: ``delta_rule_step`` and ``causal_conv1d_step`` over batches of
sequences whose states sit in scattered slots; prefill: ``chunked_delta_rule`` and
``causal_conv1d`` over ragged batches of prompts continuing from a state. Activations are
bf16, the recurrent state float32. Each case reports microseconds per call (replayed from
a CUDA graph, ``gpu_check.graph_us``), the least bytes the call must read and write (state
read and written once, every activation once), the rate that makes, its share of this
GPU's measured copy bandwidth, and its largest difference from the torch path in float32
(relative to the largest output: the kernels read bf16 and write bf16).

``--dry-run`` runs each kind of case once, small (one key head's share of the heads, at the
full head dimensions; a decode batch of 2, a prompt of 70 tokens: a chunk and some over) on
the CPU under Triton's interpreter, with the same checks and no timing
(tests/test_delta_rule_benchmark.py). Nothing here has been measured on a GPU yet.
"""

import argparse
import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DECODE_BATCHES = (1, 16, 64, 256)
PREFILLS = ((1, 4096), (8, 1024), (32, 256))  # (prompts, tokens each)
DRY_RUN_DECODE = [1, 1]
DRY_RUN_PREFILL = [70]


@dataclass(frozen=True)
class Shape:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def state_bytes(self) -> int:
        """One sequence's recurrent state (float32) and convolution state (bf16)."""
        ssm = self.num_v_heads * self.head_k_dim * self.head_v_dim * 4
        return ssm + self.conv_dim * (self.conv_kernel - 1) * 2


def qwen3_5_9b() -> Shape:
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    config = Qwen3_5TextConfig()
    return Shape(
        config.linear_num_key_heads,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        config.linear_conv_kernel_dim,
    )


@dataclass
class Batch:
    """A step's inputs: ``lens`` tokens per sequence, states in shuffled slots."""

    x: dict[str, torch.Tensor]
    conv_x: torch.Tensor
    conv_weight: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_host: list[int]
    slots: torch.Tensor
    has_state: torch.Tensor
    ssm_state: torch.Tensor
    conv_state: torch.Tensor


def make_batch(shape: Shape, lens: list[int], device: torch.device) -> Batch:
    gen = torch.Generator().manual_seed(0)
    tokens, seqs = sum(lens), len(lens)
    hk, hv, dk, dv = shape.num_k_heads, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim
    x = {
        "q": torch.randn(tokens, hk, dk, generator=gen).bfloat16(),
        "k": torch.randn(tokens, hk, dk, generator=gen).bfloat16(),
        "v": torch.randn(tokens, hv, dv, generator=gen).bfloat16(),
        "g": -torch.rand(tokens, hv, generator=gen) * 0.5,
        "beta": torch.rand(tokens, hv, generator=gen),
    }
    slots = list(range(2 * seqs))
    random.Random(0).shuffle(slots)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return Batch(
        x={name: t.to(device) for name, t in x.items()},
        conv_x=torch.randn(tokens, shape.conv_dim, generator=gen).bfloat16().to(device),
        conv_weight=torch.randn(shape.conv_dim, shape.conv_kernel, generator=gen).to(device),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        cu_host=cu,
        slots=torch.tensor(slots[:seqs], dtype=torch.int32, device=device),
        has_state=torch.ones(seqs, dtype=torch.bool, device=device),
        ssm_state=(torch.randn(2 * seqs, hv, dk, dv, generator=gen) * 0.1).to(device),
        conv_state=torch.randn(2 * seqs, shape.conv_dim, shape.conv_kernel - 1, generator=gen)
        .bfloat16()
        .to(device),
    )


def delta_rule_bytes(shape: Shape, tokens: int, seqs: int) -> int:
    """q, k, v and o in bf16, g and beta in float32, each sequence's state read and
    written."""
    qk = 2 * tokens * shape.num_k_heads * shape.head_k_dim * 2
    vo = 2 * tokens * shape.num_v_heads * shape.head_v_dim * 2
    gates = 2 * tokens * shape.num_v_heads * 4
    state = 2 * seqs * shape.num_v_heads * shape.head_k_dim * shape.head_v_dim * 4
    return qk + vo + gates + state


def conv_bytes(shape: Shape, tokens: int, seqs: int) -> int:
    """Inputs and outputs in bf16, the weight in float32, each conv state read and
    written."""
    io = 2 * tokens * shape.conv_dim * 2
    weight = shape.conv_dim * shape.conv_kernel * 4
    return io + weight + 2 * seqs * shape.conv_dim * (shape.conv_kernel - 1) * 2


def kernel_cases(
    shape: Shape, batch: Batch, decode: bool
) -> list[tuple[str, Callable, Callable, int]]:
    """(name, the Triton call, the torch path in float32, least bytes moved) for one
    step; each call runs on its own copy of the states, so repeats see the same inputs."""
    from kvserve.engine.kernels import (
        causal_conv1d_torch,
        delta_rule_torch,
        triton_causal_conv1d,
        triton_delta_rule,
    )

    b = batch
    x32 = {name: t.float() for name, t in b.x.items()}
    tokens, seqs = b.cu_host[-1], len(b.cu_host) - 1
    ssm, conv = b.ssm_state.clone(), b.conv_state.clone()
    if decode:
        return [
            (
                "delta_rule_step",
                lambda: triton_delta_rule.delta_rule_step(
                    **b.x, state=ssm, slots=b.slots, has_state=b.has_state
                ),
                lambda: delta_rule_torch.gated_delta_rule_step(
                    **x32, state=b.ssm_state.clone(), slots=b.slots, has_state=b.has_state
                ),
                delta_rule_bytes(shape, tokens, seqs),
            ),
            (
                "causal_conv1d_step",
                lambda: triton_causal_conv1d.causal_conv1d_step(
                    b.conv_x, b.conv_weight, conv, b.slots, b.has_state
                ),
                lambda: causal_conv1d_torch.causal_conv1d_step(
                    b.conv_x.float(), b.conv_weight, b.conv_state.float(), b.slots, b.has_state
                ),
                conv_bytes(shape, tokens, seqs),
            ),
        ]
    return [
        (
            "chunked_delta_rule",
            lambda: triton_delta_rule.chunked_delta_rule(
                **b.x, cu_seqlens=b.cu_seqlens, state=ssm, slots=b.slots, has_state=b.has_state
            ),
            lambda: delta_rule_torch.gated_delta_rule_chunked(
                **x32,
                cu_seqlens=b.cu_host,
                state=b.ssm_state.clone(),
                slots=b.slots,
                has_state=b.has_state,
            ),
            delta_rule_bytes(shape, tokens, seqs),
        ),
        (
            "causal_conv1d",
            lambda: triton_causal_conv1d.causal_conv1d(
                b.conv_x, b.conv_weight, b.cu_seqlens, conv, b.slots, b.has_state
            ),
            lambda: causal_conv1d_torch.causal_conv1d(
                b.conv_x.float(),
                b.conv_weight,
                b.cu_host,
                b.conv_state.float(),
                b.slots,
                b.has_state,
            ),
            conv_bytes(shape, tokens, seqs),
        ),
    ]


def dry_run_shape(shape: Shape) -> Shape:
    """One key head and its value heads, at the full head dimensions."""
    group = shape.num_v_heads // shape.num_k_heads
    return Shape(1, group, shape.head_k_dim, shape.head_v_dim, shape.conv_kernel)


def run_cases(
    shape: Shape, device: torch.device, dry_run: bool, bandwidth_gbs: float | None
) -> list[dict]:
    """Every decode and prefill case (``dry_run``: one of each, small): its sizes,
    correctness and (unless ``dry_run``) its time and rate."""
    if dry_run:
        sizes = [("decode", DRY_RUN_DECODE), ("prefill", DRY_RUN_PREFILL)]
    else:
        sizes = [("decode", [1] * n) for n in DECODE_BATCHES]
        sizes += [("prefill", [length] * n) for n, length in PREFILLS]
    results = []
    for phase, lens in sizes:
        batch = make_batch(shape, lens, device)
        for name, triton_call, torch_call, nbytes in kernel_cases(shape, batch, phase == "decode"):
            expected = torch_call().float()
            error = (triton_call().float() - expected).abs().max() / expected.abs().max()
            row = {
                "kernel": name,
                "phase": phase,
                "seqs": len(lens),
                "tokens": sum(lens),
                "bytes": nbytes,
                "max_relative_error": error.item(),
            }
            if not dry_run:
                from gpu_check import graph_us

                us = graph_us(triton_call)
                gbs = nbytes / us / 1e3
                row |= {"us": us, "GB/s": gbs, "tokens/s": sum(lens) / us * 1e6}
                if bandwidth_gbs:
                    row["bandwidth_share"] = gbs / bandwidth_gbs
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "delta_rule_kernels.json"
    )
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, no timing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are imported
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("delta_rule_kernels: no CUDA device here; try --dry-run", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    shape = dry_run_shape(qwen3_5_9b()) if args.dry_run else qwen3_5_9b()
    bandwidth = None
    if not args.dry_run:
        from gpu_check import copy_bandwidth_gbs

        bandwidth = copy_bandwidth_gbs(device)
    found = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else "cpu (interpreter)",
        "dry_run": args.dry_run,
        "shape": asdict(shape),
        "state_bytes_per_sequence_per_layer": shape.state_bytes,
        "copy_bandwidth_gbs": bandwidth,
        "cases": run_cases(shape, device, args.dry_run, bandwidth),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
