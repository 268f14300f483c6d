"""A mixture-of-experts model on a CPU against the dense model of its active size, in one run.

    OMP_NUM_THREADS=1 python benchmarks/moe_cpu.py [--dtype bf16] [--quick]

(One thread on a shared machine: with two, OpenMP's spinning threads on cores other jobs
were using ran the dense model's W1 ten times slower, 680 s against 68.)

Models (checkpoint.py): ``qwen3-moe-1b`` (Qwen3-30B-A3B's layout scaled to 1.0B parameters,
64 experts, 8 per token: 0.18B multiplied per token) and ``qwen3-dense-0.18b`` (the same
with one dense MLP of 8 experts' width). Workload: W1 (throughput.py: 64 requests, prompts of
32-512 tokens, 128 output tokens each, greedy), kvserve `LLM.generate`, one run each, the
dense one first. Then one MoE layer of the big model's shape alone, at a few token counts,
three ways: kvserve's (the tokens grouped by expert, a loop over the experts that have
tokens, each on the packed CPU kernels), the same loop on torch's matmuls, and a loop-free
one (every expert's rows padded to the longest and multiplied by ``torch.bmm``): the reason
the engine runs the first. Not a test.
"""

import argparse
import copy
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from machine import describe
from throughput import DTYPES, Workload, parse_args, prepare_dtype, run_one

from kvserve.engine.layers import fused_ops
from kvserve.engine.layers.moe.fused_moe import FusedMoE
from kvserve.engine.layers.moe.router import SoftmaxTopK
from kvserve.engine.layers.tensor_parallel import TensorParallel

HERE = Path(__file__).resolve().parent
SHAPES = ("qwen3-dense-0.18b", "qwen3-moe-1b")
EXPERTS, TOP_K, HIDDEN, INTER = 64, 8, 768, 256
TOKENS = (1, 16, 64, 512)


def run_w1(args: argparse.Namespace, dtype: str, tmp: Path) -> list[str]:
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    rows, base = [], None
    for shape in SHAPES:
        args.shape = shape
        (tmp / dtype).mkdir(exist_ok=True)
        run, spec = prepare_dtype(dtype, workload, args, tmp / shape)
        result = run_one("kvserve", dtype, spec, args, tmp)
        ckpt = run["checkpoint"]
        rate = result["output_tokens"] / result["wall_s"]
        base = base or rate
        experts = 3 * HIDDEN * INTER * TOP_K * 24 if "moe" in shape else 0  # 24 layers
        active = (ckpt.layer_linear_params + ckpt.lm_head_params + experts) / 1e9
        rows.append(
            f"| {shape} | {ckpt.num_params / 1e9:.2f} | {active:.2f} | "
            f"{result['peak_rss_mib']:.0f} | {result['wall_s']:.1f} | "
            f"{rate:.1f} ({rate / base:.2f}x) | {result['decode_step_ms']:.1f} | "
            f"{result['load']:.1f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def padded_bmm(layer: FusedMoE, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
    """The experts with no Python loop: each expert's rows gathered into a [E, longest, H]
    batch (zero rows past its own), two ``torch.bmm``, the rows added back."""
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=layer.num_experts)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(flat.numel()) - starts[flat[order]]
    longest = int(counts.max())
    tokens = torch.full((layer.num_experts, longest), x.shape[0])
    tokens[flat[order], slot] = order // ids.shape[1]
    rows = torch.cat([x, x.new_zeros(1, x.shape[1])])[tokens]
    h = torch.bmm(fused_ops.silu_and_mul(torch.bmm(rows, layer.w13.transpose(1, 2))), layer.w2.mT)
    scale = torch.zeros(layer.num_experts, longest, 1, dtype=x.dtype)
    scale[flat[order], slot, 0] = weights.flatten()[order].to(x.dtype)
    out = torch.zeros(x.shape[0] + 1, x.shape[1], dtype=x.dtype)
    out.index_add_(0, tokens.flatten(), (h * scale).flatten(0, 1))
    return out[:-1]


def timed(fn: Callable[[], torch.Tensor], seconds: float = 1.0) -> float:
    """Median milliseconds of a call, over calls for about ``seconds``."""
    fn()
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def layer_table(dtype: torch.dtype) -> list[str]:
    """One MoE layer of qwen3-moe-1b's shape, milliseconds per call three ways."""
    torch.manual_seed(0)
    layer = FusedMoE(EXPERTS, HIDDEN, INTER, TensorParallel())
    with torch.no_grad():
        layer.w13.normal_(0, 0.02)
        layer.w2.normal_(0, 0.02)
    layer = layer.to(dtype)
    packed = copy.deepcopy(layer)
    packed.process_weights_after_loading("cpu-packed")
    gate = torch.randn(HIDDEN, EXPERTS, dtype=dtype)
    lines = [
        "",
        f"One MoE layer ({EXPERTS} experts of {INTER}, {TOP_K} per token, hidden {HIDDEN}, "
        f"{str(dtype).removeprefix('torch.')}), median ms per call, "
        f"torch threads: {torch.get_num_threads()}:",
        "",
        "| tokens | experts with tokens | kvserve (grouped, packed kernels) | grouped, torch "
        "matmuls | padded bmm, no loop |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in TOKENS:
        x = torch.randn(t, HIDDEN, dtype=dtype)
        weights, ids = SoftmaxTopK(TOP_K, renormalize=True)(x @ gate)
        want = layer.grouped(x, weights, ids)
        for got in (packed(x, weights, ids), padded_bmm(layer, x, weights, ids)):
            torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())
        calls = (
            functools.partial(packed, x, weights, ids),
            functools.partial(layer.grouped, x, weights, ids),
            functools.partial(padded_bmm, layer, x, weights, ids),
        )
        ms = [timed(call) for call in calls]
        active = ids.unique().numel()
        lines.append(f"| {t} | {active} | " + " | ".join(f"{m:.2f}" for m in ms) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="8 requests, 16 output tokens")
    p.add_argument("--out", type=Path, default=HERE / "results" / "moe-cpu.md")
    mine = p.parse_args()
    args = parse_args(["--engines", "kvserve", "--dtype", mine.dtype] + ["--quick"] * mine.quick)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# A mixture-of-experts model on a CPU ({started})", "", describe(), ""]
    lines += [
        f"W1: {args.requests} requests, prompts of {args.min_prompt}-{args.max_prompt} tokens, "
        f"{args.max_tokens} output tokens each, compute dtype {mine.dtype}, kvserve "
        f"`LLM.generate`, torch threads: {torch.get_num_threads()}, one run each, in this order.",
        "",
        "| model | parameters (B) | multiplied per token (B) | peak RSS (MiB) | W1 wall (s) | "
        "output tok/s (vs dense) | decode step, one stream (ms) | load average after |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory(prefix="kvserve-moe-") as tmp:
        lines += run_w1(args, mine.dtype, Path(tmp))
    lines += [
        "",
        "At W1's batch sizes nearly every expert has tokens in every decode step (64 sequences "
        f"x {TOP_K} of {EXPERTS} experts), so a batched decode step streams all of the MoE "
        "model's weights where the dense one streams its 0.18B; one stream's decode step reads "
        f"{TOP_K} experts a layer, the dense model's bytes. On a shared machine (the load "
        "average column) the two rows' ratio moves by tens of percent between runs.",
    ]
    lines += layer_table(DTYPES[mine.dtype])
    mine.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
