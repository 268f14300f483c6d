"""The CPU kernels' per-thread scratch (csrc/cpu_workspace.c), called through ctypes: a block
is kept between calls and grown, never shrunk, one per use and per thread."""

import ctypes
import threading

import pytest

from kvserve.engine.kernels import cpu_library

SHARED, THREAD = 0, 1  # cpu_workspace.h's uses

pytestmark = pytest.mark.skipif(not cpu_library.available(), reason="no C compiler")


@pytest.fixture(scope="module")
def workspace():
    function = cpu_library.load().workspace
    function.restype, function.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_size_t]
    return function


def test_a_block_is_kept_for_calls_that_fit_it_and_grown_for_one_that_does_not(workspace):
    first = workspace(SHARED, 1 << 20)
    assert first is not None
    assert workspace(SHARED, 1 << 20) == first
    assert workspace(SHARED, 4096) == first
    grown = workspace(SHARED, 3 << 20)
    ctypes.memset(grown, 1, 3 << 20)  # all of it is this thread's to write
    assert workspace(SHARED, 1 << 20) == grown


def test_each_use_has_its_own_block(workspace):
    shared, own = workspace(SHARED, 1 << 16), workspace(THREAD, 1 << 16)
    assert shared != own
    assert workspace(SHARED, 1 << 16) == shared


def test_each_thread_has_its_own_blocks(workspace):
    mine = workspace(THREAD, 1 << 16)
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(workspace(THREAD, 1 << 16)))
    thread.start()
    thread.join()
    assert theirs[0] is not None
    assert theirs[0] != mine
    assert workspace(THREAD, 1 << 16) == mine
