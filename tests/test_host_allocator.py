"""glibc's malloc with the engine's step-memory thresholds (engine/host_allocator.py), read
from glibc's own counters (``mallinfo2``): a block of a step's size comes from the heap and
stays there once freed, where glibc's defaults map it afresh and unmap it on free. Each case
runs in a fresh interpreter, whose allocator has glibc's defaults."""

import ctypes
import ctypes.util
import json
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, json, sys
    from kvserve.engine import host_allocator

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    kept = host_allocator.keep_step_memory() if sys.argv[1] == "kept" else None
    before = libc.mallinfo2()
    block = libc.malloc(24 << 20)
    ctypes.memset(block, 1, 24 << 20)
    during = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    print(json.dumps({
        "kept": kept,
        "mapped": during.hblkhd - before.hblkhd,
        "heap_grew": during.arena - before.arena,
        "heap_left": after.arena - before.arena,
    }))
    """
)
BLOCK = 24 << 20


def glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not glibc(), reason="glibc 2.33+ (mallinfo2)")


def probe(mode: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.splitlines()[-1])


def test_a_step_sized_block_comes_from_the_heap_and_stays_there_when_freed():
    kept = probe("kept")
    assert kept["kept"] is True
    assert kept["mapped"] == 0
    assert kept["heap_grew"] >= BLOCK
    assert kept["heap_left"] >= BLOCK


def test_glibcs_defaults_map_the_same_block_and_unmap_it():
    """The control: what the engine's thresholds change."""
    defaults = probe("defaults")
    assert defaults["mapped"] >= BLOCK
    assert defaults["heap_left"] < BLOCK // 8
