"""The project's C kernels for the CPU (``csrc/``), built into one shared library and loaded
with ctypes (which drops the GIL while a kernel runs). ``run`` calls one with its arguments
by name (``cpu_signatures``: each entry point's parameters, as its prototype has them).

The library is compiled with the system C compiler on first use (about a second) into a
cache folder; ``KVSERVE_KERNEL_DIR`` names that folder instead: an image compiles it there
at build time and needs no compiler at run time. It is the same on every x86-64 CPU: its
loops are compiled for AVX-512, AVX2 and the baseline, and each call names the path to
take (``ISAS``; the default is the widest this CPU runs). Its name is a hash of the sources
and flags. Its kernels run on OpenMP threads: -fopenmp links libgomp.so.1, which in a torch
process is torch's own, already loaded, so they share torch's warm thread pool. Without a
library and without a compiler, ``load()`` is None and callers take their torch paths.
"""

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from kvserve.engine.kernels.cpu_signatures import SIGNATURES

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"]
# Linked in a second step without -ffast-math: linking with it adds gcc's crtfastmath.o,
# whose constructor turns on flush-to-zero for the whole process when the library loads.
# libmvec holds the vector expf that -ffast-math loops call.
LINK = ["-shared", "-fopenmp"]
LIBS = ["-lmvec", "-lm"]
ISAS = {"baseline": 0, "avx2": 1, "avx512": 2}


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.[ch]"))


def _cache_dir() -> Path:
    if kernel_dir := os.environ.get("KVSERVE_KERNEL_DIR"):
        return Path(kernel_dir)
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "kvserve"


def library_path() -> Path:
    key = hashlib.sha256()
    for source in sources():
        key.update(source.name.encode() + source.read_bytes())
    key.update(" ".join(FLAGS + LINK + LIBS).encode())
    return _cache_dir() / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def _build(target: Path, compiler: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        units = [s for s in sources() if s.suffix == ".c"]
        objects = [str(Path(tmp) / f"{unit.stem}.o") for unit in units]
        compiles = [  # at once: a cold start waits for the slowest file only
            subprocess.Popen([compiler, *FLAGS, "-c", str(unit), "-o", obj])
            for unit, obj in zip(units, objects, strict=True)
        ]
        codes = [process.wait() for process in compiles]
        for unit, code in zip(units, codes, strict=True):
            if code != 0:
                raise subprocess.CalledProcessError(code, f"{compiler} -c {unit}")
        built = Path(tmp) / target.name
        subprocess.run([compiler, *LINK, *objects, "-o", str(built), *LIBS], check=True)
        built.replace(target)  # atomic: concurrent builders never load half a file
    log.info("compiled the CPU kernels into %s", target)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library, built first if needed; None where it cannot be (no compiler)."""
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded first, to be shared)

    target = library_path()
    if not target.exists():
        compiler = shutil.which(os.environ.get("CC", "cc"))
        if compiler is None:
            log.warning("no C compiler found and no %s: the CPU kernels' torch paths run", target)
            return None
        _build(target, compiler)
    lib = ctypes.CDLL(str(target))
    for name, signature in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype = ctypes.c_int
        function.argtypes = [ctype for _, ctype in signature.params]
    return lib


def available() -> bool:
    return load() is not None


@functools.cache
def default_isa() -> str:
    """The widest SIMD path this CPU runs, asked once; only where ``available()``."""
    return supported_isas()[-1]


def supported_isas() -> list[str]:
    """The SIMD paths this CPU can run, narrowest first (none without a library)."""
    lib = load()
    best = lib.best_isa() if lib is not None else -1
    return [name for name, level in ISAS.items() if level <= best]


@dataclass(frozen=True)
class KernelCall:
    """One call of a kernel, as ``run`` made it: its arguments in the prototype's order,
    replayable while every address in them stays valid."""

    function: Callable[..., int]
    args: tuple
    kernel: str

    def __call__(self) -> None:
        if (status := self.function(*self.args)) != 0:
            raise _failure(self.kernel, status, self.args)


_recording: ContextVar[list[KernelCall] | None] = ContextVar("kernel_calls", default=None)


def run(kernel: str, /, **args: int | float | None) -> None:
    """Calls ``kernel`` with its arguments by name (a TypeError naming any argument missing,
    unknown or of the wrong type; a RuntimeError if the kernel fails), and appends the call
    to the list that ``recording`` gives, if one is open in this context."""
    signature = SIGNATURES[kernel]
    values = signature.arguments(args)
    function = getattr(load(), kernel)
    if (calls := _recording.get()) is not None:
        calls.append(KernelCall(function, values, kernel))
    try:
        status = function(*values)
    except ctypes.ArgumentError as error:
        raise signature.wrong_type(error) from error
    if status != 0:
        raise _failure(kernel, status, values)


def _failure(kernel: str, status: int, args: tuple) -> RuntimeError:
    """The error of a call of ``kernel`` on ``args`` that returned ``status`` (not 0)."""
    names = SIGNATURES[kernel].names
    path = ""
    if "isa" in names:
        level = args[names.index("isa")]
        path = " on the " + next((n for n, v in ISAS.items() if v == level), "?") + " path"
    return RuntimeError(f"{kernel} failed ({status}){path}")


@contextlib.contextmanager
def recording() -> Iterator[list[KernelCall]]:
    """The kernel calls ``run`` makes in this context (thread) until the block exits."""
    calls: list[KernelCall] = []
    token = _recording.set(calls)
    try:
        yield calls
    finally:
        _recording.reset(token)
