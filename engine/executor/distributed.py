"""The ranks' torch.distributed group: gloo on a CPU, NCCL on CUDA (one device per rank).

The group is made directly from a ``TCPStore`` on 127.0.0.1 (rank 0 hosts it), not through
``init_process_group``: it is no process-wide default group, so an engine's group lives and
dies with its executor, and a process may build one engine after another (or several).
"""

import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_store(port: int, rank: int, size: int, timeout: timedelta) -> dist.TCPStore:
    """Rank 0 hosts the store; the others connect to it (retrying until ``timeout``)."""
    return dist.TCPStore(
        "127.0.0.1", port, size, rank == 0, timeout=timeout, wait_for_workers=False
    )


def process_group(
    store: dist.TCPStore, rank: int, size: int, device: torch.device, timeout: timedelta
) -> Any:
    """Every rank's group; joining it waits for all the ranks (at most ``timeout``), and so
    does each collective (``_set_default_timeout`` changes that bound later)."""
    if device.type == "cuda":
        nccl = dist.ProcessGroupNCCL
        options = nccl.Options()
        options._timeout = timeout
        return nccl(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)
