"""The ranks' torch.distributed groups: gloo on a CPU, NCCL on CUDA (one device per rank).

The groups are made directly from a ``TCPStore`` (rank 0 hosts it: on 127.0.0.1 at a free
port on one node, at ``master_addr:master_port`` across nodes), not through
``init_process_group``: no process-wide default group, so an engine's groups live and die
with its executor, and a process may build one engine after another (or several).

Rank ``r`` of a world of ``tp x pp`` ranks is tensor-parallel rank ``r % tp`` of pipeline
stage ``r // tp`` (vLLM's order: a stage's ranks are neighbours, so on nodes that hold whole
stages the per-layer all-reduces stay inside a node and only the stage boundary crosses).
"""

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_store(
    port: int, rank: int, size: int, timeout: timedelta, host: str = "127.0.0.1"
) -> dist.TCPStore:
    """Rank 0 hosts the store; the others connect to it (retrying until ``timeout``)."""
    return dist.TCPStore(host, port, size, rank == 0, timeout=timeout, wait_for_workers=False)


def process_group(
    store: dist.Store, rank: int, size: int, device: torch.device, timeout: timedelta
) -> Any:
    """Every rank's group; joining it waits for all the ranks (at most ``timeout``), and so
    does each collective (``_set_default_timeout`` changes that bound later)."""
    if device.type == "cuda":
        nccl = dist.ProcessGroupNCCL
        options = nccl.Options()
        options._timeout = timeout
        return nccl(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


@dataclass(frozen=True)
class RankGroups:
    """One rank's groups: ``world`` (every rank: the pipeline's sends and receives, the KV
    block count agreed by all) and ``tensor`` (its stage's ranks; ``world`` itself when
    there is one stage, None when the stage has one rank)."""

    world: Any
    tensor: Any

    @classmethod
    def join(
        cls,
        store: dist.Store,
        rank: int,
        tp: int,
        pp: int,
        device: torch.device,
        timeout: timedelta,
    ) -> "RankGroups":
        world = process_group(store, rank, tp * pp, device, timeout)
        if pp == 1:
            return cls(world, world)
        tensor = None
        if tp > 1:
            stage_store = dist.PrefixStore(f"stage{rank // tp}", store)
            tensor = process_group(stage_store, rank % tp, tp, device, timeout)
        return cls(world, tensor)

    def set_timeout(self, timeout: timedelta) -> None:
        """Each later collective of either group waits at most ``timeout``."""
        for group in {id(g): g for g in (self.world, self.tensor) if g is not None}.values():
            group._set_default_timeout(timeout)
