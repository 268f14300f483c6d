"""Where the library of CPU kernels lives, and what runs when there is none.

An image compiles the kernel at build time into ``KVSERVE_KERNEL_DIR`` and carries no
compiler: the server must load that library, and say which attention backend it runs.
"""

import logging
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from kvserve.engine.kernels import cpu_library
from kvserve.engine.kernels.cpu_isa import cpu_flags
from kvserve.engine.layers.attention.backend import select_backend
from kvserve.engine.layers.attention.cpu_backend import CPUAttention
from kvserve.engine.layers.attention.torch_backend import TorchAttention

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture
def kernel_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_KERNEL_DIR", str(tmp_path))
    cpu_library.load.cache_clear()
    yield tmp_path
    cpu_library.load.cache_clear()


def without_compiler(monkeypatch) -> None:
    monkeypatch.setenv("CC", "kvserve-test-no-such-compiler")
    cpu_library.load.cache_clear()


def test_kernel_built_into_kernel_dir_loads_without_a_compiler(kernel_dir, monkeypatch):
    assert cpu_library.available()
    assert [p.name for p in kernel_dir.iterdir()] == [cpu_library.library_path().name]
    without_compiler(monkeypatch)
    kernel_dir.chmod(0o555)  # read-only, as in the image
    try:
        assert cpu_library.available()
    finally:
        kernel_dir.chmod(0o755)


def test_no_library_and_no_compiler_takes_torch_and_says_so(kernel_dir, monkeypatch, caplog):
    without_compiler(monkeypatch)
    with caplog.at_level(logging.INFO):
        backend = select_backend(torch.device("cpu"))
    assert type(backend) is TorchAttention
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"no C compiler found and no {cpu_library.library_path()}: "
        "the CPU kernels' torch paths run",
        "attention backend: torch (cpu, requested auto)",
    ]


def test_select_backend_logs_the_cpu_kernel(kernel_dir, caplog):
    with caplog.at_level(logging.INFO):
        backend = select_backend(torch.device("cpu"))
    assert type(backend) is CPUAttention
    assert caplog.records[-1].getMessage() == "attention backend: cpu (cpu, requested auto)"


def test_one_library_serves_every_x86_64_cpu_and_picks_its_simd_path_at_run_time(kernel_dir):
    """No -march: an image's prebuilt kernel runs on whatever CPU its pod lands on, on the
    widest path that CPU has (the flags /proc/cpuinfo lists)."""
    assert not [f for f in cpu_library.FLAGS if f.startswith(("-march", "-mcpu", "-mtune"))]
    flags = cpu_flags()
    expected = ["baseline"]
    if {"avx2", "fma"} <= flags:
        expected.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        expected.append("avx512")
    assert cpu_library.supported_isas() == expected
    assert CPUAttention().isa == expected[-1]
    assert cpu_library.library_path().parent == kernel_dir


def test_an_installed_kvserve_carries_every_kernel_source():
    """A regular (not editable) install, as the image's, compiles from the installed copy:
    the package data must name every file the library is built from."""
    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["kvserve.engine.kernels"]
    shipped = {path for pattern in globs for path in (root / "engine" / "kernels").glob(pattern)}
    sources = {path.resolve() for path in cpu_library.sources()}
    assert sources and sources <= {path.resolve() for path in shipped}


def test_loading_the_kernel_keeps_subnormal_floats(kernel_dir):
    """-ffast-math at link time would add a constructor that flushes subnormals to zero in
    every thread of the process that loads the library (numpy, hypothesis, user code)."""
    code = (
        "from kvserve.engine.kernels import cpu_library\n"
        "assert cpu_library.available()\n"
        "print(2.2250738585072014e-308 / 2 > 0)\n"
    )
    env = {**os.environ, "KVSERVE_KERNEL_DIR": str(kernel_dir)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout == "True\n", done.stderr
