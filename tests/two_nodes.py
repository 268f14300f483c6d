"""A headless node as a subprocess (``kvserve serve --headless``), for the tests that run an
engine across two "nodes" on 127.0.0.1."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvserve.engine.config import EngineConfig

from sharded_steps import free_port


def leader_config(path: Path, port: int, **settings) -> EngineConfig:
    """Node 0 of two, meeting node 1 at 127.0.0.1:``port``."""
    return EngineConfig(model=str(path), dtype="float32", nnodes=2, master_port=port, **settings)


def headless_args(config: EngineConfig) -> list[str]:
    """Node 1's command line for the leader ``config``."""
    return [
        sys.executable, "-m", "kvserve.server.cli", "serve", "--headless",
        "--model", config.model, "--dtype", config.dtype,
        "--nnodes", "2", "--node-rank", "1",
        "--master-addr", config.master_addr, "--master-port", str(config.master_port),
        "--tensor-parallel-size", str(config.tensor_parallel_size),
        "--pipeline-parallel-size", str(config.pipeline_parallel_size),
        "--num-kv-blocks", str(config.num_kv_blocks),
    ]  # fmt: skip


@contextmanager
def headless_node(config: EngineConfig) -> Iterator[subprocess.Popen]:
    """Node 1 running while the block runs; killed (and reaped) after it if still there."""
    node = subprocess.Popen(
        headless_args(config),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield node
    finally:
        if node.poll() is None:
            node.kill()
        node.communicate(timeout=30)


__all__ = ["free_port", "headless_args", "headless_node", "leader_config"]
