"""The CPU path: torch for prefill chunks, a small C kernel for decode tokens.

Decode is where a paged cache hurts the torch path: it must gather every
sequence's blocks into a padded copy before attending. ``cpu_decode.c`` reads
keys and values in place through the block table instead. It is compiled with
the system C compiler on first use (well under a second) into a cache folder,
loaded with ctypes, and run on one slice of the batch per core (ctypes drops
the GIL). ``KVSERVE_KERNEL_DIR`` names that folder instead: an image compiles
the kernel there at build time and needs no compiler at run time. A library is
named after the source, the flags and this CPU's features (``-march=native``
code must not run on another CPU). Without a matching library and without a
compiler, ``available()`` is False and the torch path runs.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from kvserve.engine.attention.torch_backend import TorchAttention

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fPIC"]
# Linked in a second step without -ffast-math: linking with it adds gcc's crtfastmath.o,
# whose constructor turns on flush-to-zero for the whole process when the library loads.
DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _cache_dir() -> Path:
    if kernel_dir := os.environ.get("KVSERVE_KERNEL_DIR"):
        return Path(kernel_dir)
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "kvserve"


def _cpu_features() -> bytes:
    """The ``flags`` line of /proc/cpuinfo (what ``-march=native`` compiles for)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith(b"flags")), b"")
    except OSError:
        return b""


def library_path() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + _cpu_features())
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
            subprocess.run([compiler, *FLAGS, "-c", str(SOURCE), "-o", str(obj)], check=True)
            subprocess.run([compiler, "-shared", str(obj), "-o", str(built), "-lm"], check=True)
            built.replace(target)  # atomic: concurrent builders never load half a file
        log.info("compiled the CPU decode attention kernel into %s", target)
    lib = ctypes.CDLL(str(target))
    lib.paged_decode.restype = None
    lib.paged_decode.argtypes = (
        [ctypes.c_void_p] * 6
        + [ctypes.c_int] * 7
        + [
            ctypes.c_float,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
    )
    return lib


def available() -> bool:
    return _library() is not None


class CPUAttention(TorchAttention):
    """``TorchAttention`` with decode tokens handled by the C kernel."""

    name = "cpu"

    def __init__(self, num_threads: int | None = None) -> None:
        self.num_threads = num_threads or torch.get_num_threads()
        self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="kvserve-attn")

    def _decode(self, query, key_cache, value_cache, meta, seqs: list[int], scale: float):
        if query.dtype not in DTYPES or key_cache.device.type != "cpu":
            return super()._decode(query, key_cache, value_cache, meta, seqs, scale)
        lib = _library()
        assert lib is not None  # chosen only where available()
        index = torch.tensor(seqs)
        tables = meta.block_tables[index].to(torch.int32).contiguous()
        lens_host = [meta.seq_lens_host[i] for i in seqs]
        seq_lens = torch.tensor(lens_host, dtype=torch.int32)
        query = query.contiguous()
        out = torch.empty_like(query)
        _, num_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[2]
        scratch_size = num_heads * max(lens_host) + num_kv_heads * head_dim
        scratch = torch.empty(self.num_threads, scratch_size, dtype=torch.float32)
        args = (
            query.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            tables.data_ptr(),
            seq_lens.data_ptr(),
            out.data_ptr(),
        )

        def run(part: int, begin: int, end: int) -> None:
            lib.paged_decode(
                *args,
                begin,
                end,
                num_heads,
                num_kv_heads,
                head_dim,
                key_cache.shape[1],
                tables.shape[1],
                scale,
                DTYPES[query.dtype],
                scratch[part].data_ptr(),
            )

        bounds = _split(lens_host, self.num_threads)
        futures = [self._pool.submit(run, i, b, e) for i, (b, e) in enumerate(bounds[1:], 1)]
        run(0, *bounds[0])
        for future in futures:
            future.result()
        return out


def _split(lengths: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges of sequences with about equal total context each."""
    total, begin, acc = sum(lengths), 0, 0
    bounds: list[tuple[int, int]] = []
    for i, length in enumerate(lengths):
        acc += length
        if acc * parts >= total * (len(bounds) + 1) and len(bounds) < parts - 1:
            bounds.append((begin, i + 1))
            begin = i + 1
    bounds.append((begin, len(lengths)))
    return bounds
