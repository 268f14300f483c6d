"""The batched LoRA kernels' cost per decode step against the base model's linear layers,
side by side in one run, on a GPU.

    python benchmarks/lora_kernels.py [--batch 64] [--adapters 8] [--rank 16] [--report PATH]
    python benchmarks/lora_kernels.py --dry-run --report PATH

Llama-3-8B's shape (32 layers; q/k/v, o, gate/up and down), bf16, ``--batch`` decode rows
spread evenly over ``--adapters`` adapters (slots in random row order), every projection
carrying a LoRA of ``--rank``. Three CUDA graphs, each replayed ``REPEATS`` times and timed
with events (median): the base step's linears (one matmul per projection per layer), the
LoRA kernels alone (one shrink and one expand per projection per layer), and both. The
goal (issue 47) is ``both / base - 1 <= 15 %``; the full decode step adds attention and the
LM head to the base, so the ratio over the linears bounds the step's from above. The
kernels' output on one layer is checked against the float32 torch product first.

``--dry-run`` runs the same code on the CPU under Triton's interpreter at a tiny shape with
no graphs (the times mean nothing): what tests/test_lora_kernels_benchmark.py checks.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 20
ACCURACY = 2**-6  # of the largest |LoRA delta|: bf16 operands and one bf16 rounding


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    q: int
    kv: int
    intermediate: int

    def projections(self) -> dict[str, tuple[int, list[int]]]:
        """name → (input features, output features of each part)."""
        return {
            "qkv": (self.hidden, [self.q, self.kv, self.kv]),
            "o": (self.q, [self.hidden]),
            "gate_up": (self.hidden, [self.intermediate, self.intermediate]),
            "down": (self.intermediate, [self.hidden]),
        }


LLAMA3_8B = Shape(layers=32, hidden=4096, q=4096, kv=1024, intermediate=14336)
DRY_RUN_SHAPE = Shape(layers=2, hidden=64, q=64, kv=16, intermediate=96)


@dataclass
class Projection:
    """One projection of one layer: its base weight and LoRA stacks, as ``LoRALinear``
    holds them."""

    weight: torch.Tensor
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    offsets: torch.Tensor
    sizes: torch.Tensor
    max_size: int


def build(shape: Shape, adapters: int, rank: int, device: torch.device, dtype: torch.dtype):
    """Every layer's projections, random weights of a trained model's scale."""
    layers = []
    for _ in range(shape.layers):
        layer = {}
        for name, (k, sizes) in shape.projections().items():
            n, parts = sum(sizes), len(sizes)
            weight = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
            lora_a = torch.randn(adapters, parts * rank, k, device=device, dtype=dtype) / k**0.5
            lora_b = torch.zeros(adapters, n, parts * rank, device=device, dtype=dtype)
            offsets = np.cumsum([0, *sizes[:-1]]).tolist()
            for p, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
                block = torch.randn(adapters, size, rank, device=device, dtype=dtype) / rank
                lora_b[:, offset : offset + size, p * rank : (p + 1) * rank] = block
            layer[name] = Projection(
                weight,
                lora_a,
                lora_b,
                torch.tensor(offsets, dtype=torch.int32, device=device),
                torch.tensor(sizes, dtype=torch.int32, device=device),
                max(sizes),
            )
        layers.append(layer)
    return layers


def base_step(layers, inputs: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]) -> None:
    for layer in layers:
        for name, proj in layer.items():
            torch.matmul(inputs[name], proj.weight.T, out=outs[name])


def lora_step(layers, inputs, outs, segments, rank: int) -> None:
    from kvserve.engine.kernels.triton_lora import lora_expand, lora_shrink

    for layer in layers:
        for name, proj in layer.items():
            shrunk = lora_shrink(inputs[name], proj.lora_a, segments, len(proj.sizes), rank)
            lora_expand(
                outs[name],
                shrunk,
                proj.lora_b,
                segments,
                proj.offsets,
                proj.sizes,
                proj.max_size,
                rank,
            )


def max_error(layer, inputs, row_slots: np.ndarray, segments, rank: int) -> float:
    """The kernels' delta on ``layer`` against float32 torch, as a fraction of its largest
    element."""
    worst = 0.0
    for name, proj in layer.items():
        out = torch.zeros(inputs[name].shape[0], proj.weight.shape[0], device=proj.weight.device)
        out = out.to(proj.weight.dtype)
        lora_step([{name: proj}], inputs, {name: out}, segments, rank)
        slots = torch.from_numpy(row_slots).to(out.device).long()
        a, b = proj.lora_a.float()[slots], proj.lora_b.float()[slots]
        ref = torch.einsum("mk,mrk->mr", inputs[name].float(), a)
        ref = torch.einsum("mr,mnr->mn", ref, b)
        worst = max(worst, ((out.float() - ref).abs().max() / ref.abs().max()).item())
    return worst


def time_us(run, device: torch.device) -> float:
    """Median microseconds of one replay of ``run`` captured in a CUDA graph; on the CPU
    (dry run) one call's wall time."""
    run()
    if device.type != "cuda":
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm up on the side stream, as CUDA graph capture asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def measure(shape: Shape, batch: int, adapters: int, rank: int, device: torch.device) -> dict:
    from kvserve.engine.kernels.lora_segments import lora_segments

    torch.manual_seed(0)
    layers = build(shape, adapters, rank, device, torch.bfloat16)
    row_slots = np.random.default_rng(0).permutation(np.arange(batch) % adapters)
    segments = lora_segments(row_slots.astype(np.int32), device)
    assert segments is not None
    inputs, outs = {}, {}
    for name, (k, sizes) in shape.projections().items():
        inputs[name] = torch.randn(batch, k, device=device, dtype=torch.bfloat16)
        outs[name] = torch.empty(batch, sum(sizes), device=device, dtype=torch.bfloat16)
    error = max_error(layers[0], inputs, row_slots, segments, rank)

    def both() -> None:
        base_step(layers, inputs, outs)
        lora_step(layers, inputs, outs, segments, rank)

    base_us = time_us(lambda: base_step(layers, inputs, outs), device)
    lora_us = time_us(lambda: lora_step(layers, inputs, outs, segments, rank), device)
    both_us = time_us(both, device)
    return {
        "shape": asdict(shape),
        "batch": batch,
        "adapters": adapters,
        "rank": rank,
        "max_error": error,
        "base_us": base_us,
        "lora_us": lora_us,
        "both_us": both_us,
        "overhead": both_us / base_us - 1,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=64, help="decode rows")
    p.add_argument("--adapters", type=int, default=8, help="adapters, rows spread evenly")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--report", type=Path, help="default: benchmarks/results/lora-kernels-*.json")
    p.add_argument("--dry-run", action="store_true", help="tiny shape, CPU interpreter")
    args = p.parse_args(argv)
    if args.dry_run and args.report is None:
        p.error("--dry-run needs --report (it must not overwrite a measured report)")
    if min(args.batch, args.adapters, args.rank) < 1 or args.adapters > args.batch:
        p.error("--batch, --adapters and --rank must be positive, --adapters at most --batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel module is first imported
        shape, device, device_name = DRY_RUN_SHAPE, torch.device("cpu"), "cpu"
    else:
        if not torch.cuda.is_available():
            print("lora_kernels: no CUDA device here; nothing was run", file=sys.stderr)
            return 2
        shape, device = LLAMA3_8B, torch.device("cuda")
        device_name = torch.cuda.get_device_name()
    found = measure(shape, args.batch, args.adapters, args.rank, device)
    found["device"] = device_name
    if found["max_error"] > ACCURACY:
        print(f"lora_kernels: max error {found['max_error']:.3g} > {ACCURACY}", file=sys.stderr)
        return 1
    print(
        f"{device_name}: {args.batch} rows, {args.adapters} adapters of rank {args.rank}, "
        f"{shape.layers} layers: base linears {found['base_us']:.1f} us, LoRA kernels "
        f"{found['lora_us']:.1f} us, both {found['both_us']:.1f} us "
        f"({100 * found['overhead']:+.1f} % over the base)"
    )
    slug = device_name.lower().replace(" ", "-")
    report = args.report or ROOT / "benchmarks" / "results" / f"lora-kernels-{slug}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(found, indent=2) + "\n")
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
