"""Facts about this machine, measured in the benchmark's own run: memory bandwidth, matmul
rate, and a description (CPU model, cores, load) for the results file."""

import os
import platform
import time
from pathlib import Path

import torch

from kvserve.engine.kernels import cpu_isa
from kvserve.engine.layers.cpu_linear.packed_linear import can_pack, packed


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 8) -> float:
    """Best bytes moved per second (read + written) copying a `nbytes` tensor into another."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_seconds(lambda: dst.copy_(src), repeats) / 1e9


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """Best rate of an n×n by n×n matrix product in `dtype`, through the linear layer the
    engine packs for it here, where it packs one (torch's plain float32 matmul takes MKL's
    narrower path on AMD CPUs, at ~40 % of the packed layer's rate there, so it would
    understate the floor)."""
    a = torch.randn(n, n).to(dtype)
    layer = torch.nn.Linear(n, n, bias=False).to(dtype)
    if can_pack(dtype, a.device):
        layer = packed(layer)
    with torch.inference_mode():
        return 2 * n**3 / _best_seconds(lambda: layer(a), repeats) / 1e9


def cpu_model() -> str:
    """The first CPU's model name with its family and model numbers (a VM may show only the
    vendor's line, "AMD EPYC", for every generation), and whether ``hold_avx2`` holds this
    process to AVX2 (it sets ``HOLD_AVX2``, which the processes started from here inherit)."""
    fields = cpu_isa.first_cpu(Path("/proc/cpuinfo").read_text())
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    if os.environ.get("HOLD_AVX2"):
        name += " held to AVX2 (benchmarks/hold_avx2)"
    return name


def cpu_flags(
    names: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"),
) -> str:
    """Which of the flags that pick the kernels and the dtype (`names`) this CPU has, e.g.
    "avx2 yes, avx512f no, ..."."""
    have = cpu_isa.cpu_flags()
    return ", ".join(f"{name} {'yes' if name in have else 'no'}" for name in names)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def describe() -> str:
    import transformers

    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs (nproc), torch {torch.__version__}, "
        f"transformers {transformers.__version__}, python {platform.python_version()}"
    )
