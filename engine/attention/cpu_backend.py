"""The CPU path: torch for prefill chunks, a small C kernel for decode tokens.

Decode is where a paged cache hurts the torch path: it must gather every
sequence's blocks into a padded copy before attending. ``cpu_decode.c`` reads
keys and values in place through the block table instead, on torch's own OpenMP
threads. It is compiled with the system C compiler on first use (about a second)
into a cache folder and loaded with ctypes (which drops the GIL while it runs).
``KVSERVE_KERNEL_DIR`` names that folder instead: an image compiles the kernel
there at build time and needs no compiler at run time. The library is the same on
every x86-64 CPU: its loops are compiled for AVX-512, AVX2 and the baseline, and it
picks the widest one this CPU runs when called. A library is named after its sources
and flags. Without a matching library and without a compiler, ``available()`` is
False and the torch path runs.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from kvserve.engine.attention.torch_backend import TorchAttention

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(n) for n in ("cpu_decode.c", "cpu_decode_isa.h")]
FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"]
# Linked in a second step without -ffast-math: linking with it adds gcc's crtfastmath.o,
# whose constructor turns on flush-to-zero for the whole process when the library loads.
# -fopenmp links libgomp.so.1, which in a torch process is torch's own, already loaded.
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
ISAS = {"baseline": 0, "avx2": 1, "avx512": 2}


def _cache_dir() -> Path:
    if kernel_dir := os.environ.get("KVSERVE_KERNEL_DIR"):
        return Path(kernel_dir)
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "kvserve"


def library_path() -> Path:
    key = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES) + " ".join(FLAGS).encode())
    return _cache_dir() / f"cpu_decode-{key.hexdigest()[:16]}.so"


@functools.cache
def _library() -> ctypes.CDLL | None:
    target = library_path()
    if not target.exists():
        compiler = shutil.which(os.environ.get("CC", "cc"))
        if compiler is None:
            log.warning(
                "no C compiler found and no %s: CPU decode attention uses the torch path", target
            )
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built, obj = Path(tmp) / target.name, Path(tmp) / "cpu_decode.o"
            compile_ = [compiler, *FLAGS, "-c", str(SOURCES[0]), "-o", str(obj)]
            subprocess.run(compile_, check=True)
            link = [compiler, "-shared", "-fopenmp", str(obj), "-o", str(built), "-lm"]
            subprocess.run(link, check=True)
            built.replace(target)  # atomic: concurrent builders never load half a file
        log.info("compiled the CPU decode attention kernel into %s", target)
    lib = ctypes.CDLL(str(target))
    lib.best_isa.restype = ctypes.c_int
    lib.best_isa.argtypes = []
    lib.paged_decode.restype = ctypes.c_int
    lib.paged_decode.argtypes = (
        [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float] + [ctypes.c_int] * 3
    )
    return lib


def available() -> bool:
    return _library() is not None


def supported_isas() -> list[str]:
    """The SIMD paths this CPU can run, narrowest first."""
    lib = _library()
    best = lib.best_isa() if lib is not None else -1
    return [name for name, level in ISAS.items() if level <= best]


class CPUAttention(TorchAttention):
    """``TorchAttention`` with decode tokens handled by the C kernel, on ``isa`` (default:
    the widest SIMD path this CPU runs) and torch's intra-op thread count."""

    name = "cpu"

    def __init__(self, isa: str | None = None) -> None:
        self.isa = isa or supported_isas()[-1]

    def _decode(self, query, key_cache, value_cache, meta, seqs: list[int], scale: float):
        if query.dtype not in DTYPES or key_cache.device.type != "cpu":
            return super()._decode(query, key_cache, value_cache, meta, seqs, scale)
        lib = _library()
        assert lib is not None  # chosen only where available()
        if len(seqs) == meta.num_seqs:
            tables, seq_lens = meta.block_tables, meta.seq_lens
        else:
            index = torch.tensor(seqs)
            tables, seq_lens = meta.block_tables[index], meta.seq_lens[index]
        tables = tables.to(torch.int32).contiguous()
        seq_lens = seq_lens.to(torch.int32).contiguous()
        query = query.contiguous()
        out = torch.empty_like(query)
        _, num_heads, head_dim = query.shape
        status = lib.paged_decode(
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            tables.data_ptr(),
            seq_lens.data_ptr(),
            out.data_ptr(),
            len(seqs),
            num_heads,
            key_cache.shape[2],
            head_dim,
            key_cache.shape[1],
            tables.shape[1],
            scale,
            DTYPES[query.dtype],
            torch.get_num_threads(),
            ISAS[self.isa],
        )
        if status != 0:
            raise RuntimeError(f"paged_decode failed ({status}) on the {self.isa} path")
        return out
