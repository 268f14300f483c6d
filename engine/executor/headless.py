"""A headless node (``kvserve serve --headless``): a worker node of a multi-node engine.

It runs only its ranks, ``node_rank * local .. node_rank * local + local - 1`` (``local`` =
world size / nnodes), each a worker process (``worker.py``) that meets the leader's
rendezvous at ``master_addr:master_port``, dials the leader for its step socket, loads its
shard and runs the steps the leader sends. No API server, no scheduler: the leader (node 0)
has those. The node lives as long as its ranks: when the leader shuts down they exit and so
does the node (code 0); when one fails or is killed the node ends the others and exits 1, so
that the group is restarted as one (a LeaderWorkerSet's ``RecreateGroupOnPodRestart``).
SIGTERM or SIGINT ends the ranks too.
"""

import logging
import multiprocessing
import multiprocessing.connection
import signal
from types import FrameType

import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.executor.multiproc import JOIN_TIMEOUT_S, STARTUP_TIMEOUT_S, STEP_TIMEOUT_S
from kvserve.engine.executor.worker import WorkerSpec, run_worker

log = logging.getLogger(__name__)


def run_headless(config: EngineConfig) -> int:
    """Run this node's ranks until they end; the exit code (0: the leader ended them)."""
    local = config.local_world_size
    first = config.node_rank * local
    threads = max(1, torch.get_num_threads() // local)
    context = multiprocessing.get_context("spawn")
    processes = []
    for index in range(local):
        spec = WorkerSpec(
            first + index,
            config.world_size,
            config.master_port,
            config,
            threads,
            STARTUP_TIMEOUT_S,
            STEP_TIMEOUT_S,
            config.master_addr,
            index,
        )
        process = context.Process(
            target=run_worker, args=(spec, None), name=f"kvserve-rank{first + index}"
        )
        process.start()
        processes.append(process)
    log.info(
        "node %d of %d: ranks %d..%d of %d, meeting the leader at %s:%d (within %g s)",
        config.node_rank,
        config.nnodes,
        first,
        first + local - 1,
        config.world_size,
        config.master_addr,
        config.master_port,
        config.distributed_timeout_seconds,
    )

    def stop(signum: int, _: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        running = list(processes)
        while running:
            multiprocessing.connection.wait([p.sentinel for p in running])
            for process in [p for p in running if p.exitcode is not None]:
                running.remove(process)
                if process.exitcode != 0:
                    log.error("%s exited with code %s", process.name, process.exitcode)
                    code = 1
            if code:
                break
    except (SystemExit, KeyboardInterrupt):
        code = 1
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(JOIN_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
    return code
