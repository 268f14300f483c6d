"""Holds every Python process started with this folder on PYTHONPATH to AVX2, on an AVX-512
host: an approximation of the issue's AVX2-only AMD kind for the benchmarks, with both
engines on their AVX2 code. It holds the instruction set only, not that machine's clocks,
caches or memory.

- torch and oneDNN: ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``.
- vLLM: torch's ``torch.cpu._is_avx512*`` and ``_is_amx*`` answer False, so it loads its
  ``_C_AVX2`` kernels and takes its non-AMX paths.
- kvserve: its kernels' widest path is AVX2, and the CPU has no native bf16 (no AVX-512 or
  AMX flags), so it packs and computes as it would there.

Use: ``PYTHONPATH=benchmarks/hold_avx2 python benchmarks/throughput.py ...`` (the runners
and servers it starts inherit the variable). Python runs this file at start-up. The results
files say so: the CPU's name there ends in "held to AVX2" (``HOLD_AVX2``, machine.py)."""

import os
import sys

os.environ["HOLD_AVX2"] = "1"  # benchmarks/machine.py's cpu_model() names the hold
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import torch


def _no(*args: object) -> bool:
    return False


for _name in dir(torch.cpu):
    if _name.startswith(("_is_avx512", "_is_amx")):
        setattr(torch.cpu, _name, _no)

try:
    from kvserve.engine.kernels import cpu_isa, cpu_library
    from kvserve.engine.layers.cpu_linear import amx_linear, dpbf16_linear
except ImportError:  # vLLM's venv
    pass
else:
    _isas = cpu_library.supported_isas
    cpu_library.supported_isas = lambda: [isa for isa in _isas() if isa != "avx512"]
    _flags = frozenset(f for f in cpu_isa.cpu_flags() if not f.startswith(("avx512", "amx")))
    cpu_isa.cpu_flags = lambda: _flags
    amx_linear._usable = dpbf16_linear._usable = _no

print(f"[hold_avx2] {sys.argv[0]}: torch capability {torch.backends.cpu.get_cpu_capability()}",
      file=sys.stderr)  # fmt: skip
