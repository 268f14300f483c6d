"""A worker process: ranks 1..N-1 of a ``MultiprocExecutor`` (on the leader's node), or a
rank of a headless node (``headless.py``), which dials the leader for its step socket.

Started with multiprocessing's "spawn" (a fresh interpreter: no copy of the engine's threads
or CUDA state), it joins the process group, builds its ``ModelRunner`` (its weight shard and
its part of every KV block; its warm-up step meets rank 0's), says ``Ready``, then runs each
step rank 0 sends (discarding the logits) until ``Shutdown`` or until rank 0 closes
the socket. If it raises it reports ``Failed`` and exits; its collectives then fail on rank 0,
which declares the engine dead.

It dies with its parent: a thread waits on the parent's sentinel and ends the process the
moment the parent is gone, even while the main thread is stuck in a collective. (prctl's
PR_SET_PDEATHSIG would fire when the *thread* that started the worker ends, and the engine
is built on a thread that ends once it is built: see ``engine_builder.build_engine``.)
"""

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import socket
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kvserve.engine.config import EngineConfig
from kvserve.engine.execution_plan import plan_execution
from kvserve.engine.executor import messages
from kvserve.engine.executor.distributed import RankGroups, rendezvous_store
from kvserve.engine.executor.model_runner import ModelRunner, StepInputs
from kvserve.engine.executor.node_link import dial_leader
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.model_config import ModelConfig


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    size: int
    port: int
    """The rendezvous store's port on ``host`` (rank 0 holds the store)."""
    config: EngineConfig
    threads: int
    """torch threads on a CPU: the cores divided among the node's ranks."""
    startup_timeout_s: float
    step_timeout_s: float
    host: str = "127.0.0.1"
    local_rank: int | None = None
    """Its index among its node's ranks (its CUDA device); None: ``rank``."""


def run_worker(spec: WorkerSpec, sock: socket.socket | None) -> None:
    """The worker process's entry point; ``sock`` None: a rank of a headless node, which
    dials the leader (``node_link.dial_leader``) for its step socket."""
    _die_with_parent()
    store = None
    if sock is None:
        try:
            timeout = spec.config.distributed_timeout_seconds
            store, sock = dial_leader(spec.host, spec.port, spec.rank, spec.size, timeout)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    messages.send(sock, messages.Arrived(spec.rank))
    try:
        runner = _build(spec, store)
        messages.send(sock, messages.Ready(spec.rank))
        while True:
            try:
                message = messages.receive(sock)
            except EOFError:
                break  # rank 0 is gone: shutting down or dead
            if isinstance(message, messages.Shutdown):
                break
            assert isinstance(message, messages.Step), message
            runner.run(_to(message.unpack(), runner.plan.device))
    except BaseException:
        error = traceback.format_exc()
        try:
            messages.send(sock, messages.Failed(spec.rank, error))
        finally:
            os._exit(1)  # no clean-up that could block on the broken group
    os._exit(0)


def _build(spec: WorkerSpec, store: dist.Store | None) -> ModelRunner:
    config = spec.config
    model_config = ModelConfig.from_dir(config.model, config.quantization)
    plan = plan_execution(config, model_config, rank=spec.rank)
    if plan.device.type == "cuda":
        torch.cuda.set_device(spec.rank if spec.local_rank is None else spec.local_rank)
    else:
        torch.set_num_threads(spec.threads)
    timeout = timedelta(seconds=spec.startup_timeout_s)
    if store is None:
        store = rendezvous_store(spec.port, spec.rank, spec.size, timeout, spec.host)
    tp_size = config.tensor_parallel_size
    groups = RankGroups.join(
        store, spec.rank, tp_size, config.pipeline_parallel_size, plan.device, timeout
    )
    tp = TensorParallel(spec.rank % tp_size, tp_size, groups.tensor)
    pp = PipelineParallel.of_rank(spec.rank, tp_size, config.pipeline_parallel_size)
    runner = ModelRunner(config, model_config, plan, tp=tp, pp=pp.joined(groups.world))
    groups.set_timeout(timedelta(seconds=spec.step_timeout_s))
    runner.pp.timeout = timedelta(seconds=spec.step_timeout_s)
    return runner


def _to(inputs: StepInputs, device: torch.device) -> StepInputs:
    """The step's tensors on this rank's device (on a CPU: as they came). A per-layer
    metadata list repeats each group's object: each is moved once and stays shared."""
    if device.type == "cpu":
        return inputs
    metas = inputs.meta if isinstance(inputs.meta, list) else [inputs.meta]
    for meta in {id(m): m for m in metas}.values():
        for field in dataclasses.fields(meta):
            value = getattr(meta, field.name)
            if isinstance(value, torch.Tensor):
                setattr(meta, field.name, value.to(device, non_blocking=True))
    inputs.input_ids = inputs.input_ids.to(device, non_blocking=True)
    inputs.positions = inputs.positions.to(device, non_blocking=True)
    inputs.logits_indices = inputs.logits_indices.to(device, non_blocking=True)
    return inputs


def _die_with_parent() -> None:
    parent = multiprocessing.parent_process()
    assert parent is not None, "a worker is started by multiprocessing"

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="kvserve-parent-watch", daemon=True).start()
