"""Tensor and pipeline parallelism over processes: rank 0 in the engine's process, ranks
1..N-1 in worker processes (``worker.py``): this node's, spawned here, and with several
nodes the other nodes' (started by their headless node, ``headless.py``), which connect to
the rendezvous at ``master_addr:master_port`` and then to this process's step listener
(``node_link.py``) within ``distributed_timeout_seconds``, else an error names each node that
never arrived. A rank on another node is known by its socket alone: its connection closing
is its death, with the same consequences as a local worker's exit.

Rank 0 runs in the engine's own process, on the engine thread: the scheduler, the KV-cache
manager and the sampler stay where they are, and the logits never cross a process boundary
(the LM head gathers them on every rank; the workers discard theirs). Each step rank 0
prepares the ``StepInputs`` (``ModelRunner.prepare``), sends them to every worker, and all
ranks run the forward, whose collectives meet inside the layers (``TensorParallel``).

Start: the workers are spawned; each says ``Arrived`` (within ``CONNECT_TIMEOUT_S``, else an
error names the rank that never did), all join the process group (``distributed.py``: a
``TCPStore`` on 127.0.0.1 at a free port, gloo on a CPU, NCCL on CUDA with one device per
rank), build their runner and say ``Ready``. On a CPU every rank, rank 0's process included,
runs ``cores // size`` torch threads, so the ranks do not oversubscribe the cores.

Transport of the step inputs: one pickled frame over a socket pair per worker, pickled once
for all workers, its tensors as numpy arrays (``messages.Step``). Measured by
``benchmarks/executor_transport.py`` (2 ranks, 1 thread each, gloo, a shared 2-core CPU; µs
per step, median of 300, from rank 0's send until the worker holds the inputs, a one-element
all-reduce subtracted; two runs, the spread is the machine's load):

    ====================  ============  =============  ================  ===========
    step                  socket, numpy socket, torch  broadcast_object  broadcast
                          (kept)        pickle                           tensors
    ====================  ============  =============  ================  ===========
    decode, 64 sequences  338 / 394     1262 / 1327    2060 / 1799       969 / 2053
    prefill, 2048 tokens  278 / 380     1257 / 1327    1513 / 1828       704 / 2056
    ====================  ============  =============  ================  ===========

(broadcast_object: the pickle's length and bytes by two gloo broadcasts, as
``broadcast_object_list`` does; broadcast tensors: the rest so, then one broadcast per tensor.)
A torch tensor pickles through ``torch.save``, ~100 µs each; a numpy array as its bytes.

Faults: a worker that dies (even by SIGKILL) breaks the step's collectives at once (gloo:
"connection reset by peer") or the next send; one that raises reports ``Failed`` and exits,
so the same happens; one that stops answering makes rank 0's next collective time out after
``STEP_TIMEOUT_S`` (the process group's timeout, set once every rank is ready; a send to a
worker that no longer reads is bounded by the same time). Any of these raises
``ExecutorFailedError`` from ``execute``, naming the rank and what it said or how it
exited; the engine is then dead at once (no retry: the ranks no longer agree on where they
are). ``check_health`` notices a worker gone between steps. ``shutdown`` asks each worker
to stop, waits ``JOIN_TIMEOUT_S``, kills what is left and reaps every process; a worker also
dies with the engine's process (see ``worker.py``).
"""

import logging
import multiprocessing
import multiprocessing.connection
import signal
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.process import BaseProcess

import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.execution_plan import ExecutionPlan
from kvserve.engine.executor import messages, micro_batches
from kvserve.engine.executor.distributed import RankGroups, free_port, rendezvous_store
from kvserve.engine.executor.model_runner import ModelRunner, StepInputs
from kvserve.engine.executor.node_link import NodeListener
from kvserve.engine.executor.worker import WorkerSpec, run_worker
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.startup import StartupPhases

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0
"""How long a spawned worker may take to start (import torch) and say ``Arrived``."""
STARTUP_TIMEOUT_S = 1800.0
"""How long the ranks may wait for each other while loading (a large checkpoint)."""
STEP_TIMEOUT_S = 30.0
"""How long a rank waits in one collective of a step before the step fails."""
JOIN_TIMEOUT_S = 5.0
"""How long shutdown waits for a worker to exit before it kills it."""
FAILURE_REPORT_S = 1.0
"""After a failed step, how long rank 0 waits for the workers' own account of it."""


class ExecutorFailedError(RuntimeError):
    """A rank failed: the group can run no further step."""


class _Worker:
    """A rank's process (None: on another node, known by its socket alone) and socket."""

    def __init__(
        self,
        rank: int,
        process: BaseProcess | None,
        sock: socket.socket,
        where: str = "",
    ) -> None:
        self.rank = rank
        self.process = process
        self.sock = sock
        self.where = where  # on another node: "node N at ADDRESS"
        self.report: str | None = None  # what it said when it failed
        self.lost = False  # on another node: its socket closed

    @property
    def sentinels(self) -> list[socket.socket | int]:
        return [self.sock] if self.process is None else [self.sock, self.process.sentinel]

    def is_alive(self) -> bool:
        """A local worker's process runs; a remote one's socket has nothing to read (a
        ``Failed`` or the end of the connection)."""
        if self.process is not None:
            return self.process.is_alive()
        if self.lost or self.report is not None:
            return False
        return not multiprocessing.connection.wait([self.sock], 0)

    def join(self, timeout: float) -> None:
        if self.process is not None:
            self.process.join(timeout)

    def read_report(self, timeout: float) -> None:
        """Take a ``Failed`` the worker sent, if one comes within ``timeout``."""
        if self.report is not None:
            return
        try:
            ready = multiprocessing.connection.wait([self.sock], timeout)
            if ready:
                self.sock.settimeout(timeout)
                message = messages.receive(self.sock)
                if isinstance(message, messages.Failed):
                    self.report = message.error.strip().splitlines()[-1]
        except (OSError, EOFError):
            self.lost = True

    def describe(self) -> str | None:
        """How this worker failed, or None while it runs and said nothing."""
        if self.report is not None:
            return f"tensor-parallel rank {self.rank} failed: {self.report}"
        if self.process is None:
            if not self.lost:
                return None
            return f"rank {self.rank} ({self.where}) is gone: its connection closed"
        code = self.process.exitcode
        if code is None:
            return None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
        return f"tensor-parallel rank {self.rank} (pid {self.process.pid}) exited with {how}"


class MultiprocExecutor:
    """Rank 0's ``ModelRunner`` plus the worker processes of ranks 1..N-1 (see the module)."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        plan: ExecutionPlan,
        progress: Callable[[int, int], None] | None = None,
        startup: StartupPhases | None = None,
    ) -> None:
        size, local = config.world_size, config.local_world_size
        tp_size, pp_size = config.tensor_parallel_size, config.pipeline_parallel_size
        self.step_timeout_s = step_timeout_s = STEP_TIMEOUT_S
        self.workers: list[_Worker] = []
        self._failure: str | None = None
        self._stopped = False
        self._threads_before = torch.get_num_threads()
        threads = max(1, self._threads_before // local)
        if plan.device.type == "cpu":
            torch.set_num_threads(threads)
        multinode = config.nnodes > 1
        port = config.master_port if multinode else free_port()
        startup_timeout = timedelta(seconds=STARTUP_TIMEOUT_S)
        # the store listens on every interface; this node's ranks reach it on 127.0.0.1, so
        # the leader never needs to resolve master_addr, the other nodes' address for it
        store = rendezvous_store(port, 0, size, startup_timeout)
        listener = NodeListener(store, config.master_addr) if multinode else None
        context = multiprocessing.get_context("spawn")
        try:
            for rank in range(1, local):
                ours, theirs = socket.socketpair()
                spec = WorkerSpec(
                    rank, size, port, config, threads, STARTUP_TIMEOUT_S, step_timeout_s
                )
                process = context.Process(
                    target=run_worker,
                    args=(spec, theirs),
                    name=f"kvserve-tp-rank{rank}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                self.workers.append(_Worker(rank, process, ours))
            self._await(messages.Arrived, CONNECT_TIMEOUT_S, "did not start")
            if listener is not None:
                self._accept(listener, range(local, size), local, config)
            groups = RankGroups.join(store, 0, tp_size, pp_size, plan.device, startup_timeout)
            tp = TensorParallel(0, tp_size, groups.tensor)
            pp = PipelineParallel.of_rank(0, tp_size, pp_size).joined(groups.world)
            try:
                self.runner = ModelRunner(config, model_config, plan, progress, startup, tp, pp)
            except Exception as exc:
                raise self._failed(exc) from exc
            self._await(messages.Ready, STARTUP_TIMEOUT_S, "did not load the model")
            groups.set_timeout(timedelta(seconds=step_timeout_s))
            pp.timeout = timedelta(seconds=step_timeout_s)
            for worker in self.workers:
                worker.sock.settimeout(step_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        self.plan = self.runner.plan
        self.store = store  # the group's rendezvous: kept for the group's lifetime

    def _accept(
        self, listener: NodeListener, ranks: range, local: int, config: EngineConfig
    ) -> None:
        """The other nodes' ranks, each connected and ``Arrived`` within the rendezvous
        timeout; else ``ExecutorFailedError`` naming the nodes that never came."""
        try:
            arrived = listener.accept(
                ranks, local, config.distributed_timeout_seconds, config.master_port
            )
        except TimeoutError as exc:
            raise ExecutorFailedError(str(exc)) from None
        for rank, (sock, address) in sorted(arrived.items()):
            where = f"node {rank // local} at {address}"
            self.workers.append(_Worker(rank, None, sock, where))

    @property
    def pids(self) -> list[int]:
        """The local workers' process ids."""
        return [w.process.pid for w in self.workers if w.process and w.process.pid is not None]

    def _await(self, kind: type, timeout: float, what: str) -> None:
        """Every worker's next message is a ``kind`` within ``timeout``, else an error that
        names the first rank that failed, exited or stayed silent."""
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            left = deadline - time.monotonic()
            if not multiprocessing.connection.wait(worker.sentinels, max(left, 0)):
                raise ExecutorFailedError(
                    f"tensor-parallel rank {worker.rank} {what} within {timeout:.0f} s"
                )
            try:
                message = messages.receive(worker.sock)
            except (OSError, EOFError):
                worker.lost = True
                worker.join(FAILURE_REPORT_S)
                message = None
            if isinstance(message, messages.Failed):
                worker.report = message.error.strip().splitlines()[-1]
                log.error("tensor-parallel rank %d failed:\n%s", worker.rank, message.error)
            if not isinstance(message, kind):
                worker.join(FAILURE_REPORT_S)
                raise ExecutorFailedError(worker.describe() or f"rank {worker.rank}: {message}")

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Prepare the step, send it to every worker, run rank 0's part; the logits. With
        several pipeline stages the step goes as micro-batches (``micro_batches.py``)."""
        stages = self.runner.pp.size
        if stages == 1:
            return self.run(self.prepare(out))
        parts = micro_batches.split(out, stages)
        batches = [self.runner.prepare(part) for part in parts]
        return self._send_and_run(
            batches,
            lambda: micro_batches.join_logits(parts, self.runner.run_micro_batches(batches)),
        )

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """The step's inputs (rank 0's ``ModelRunner.prepare``), one batch: async scheduling
        runs no pipeline stages."""
        return self.runner.prepare(out)

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Send prepared inputs to every worker and run rank 0's part; the logits."""
        return self._send_and_run([inputs], lambda: self.runner.run(inputs))

    def _send_and_run(
        self, batches: list[StepInputs], run_local: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        if self._failure is not None:
            raise ExecutorFailedError(self._failure)
        try:
            for inputs in batches:
                frame = messages.frame(messages.Step.of(inputs))
                for worker in self.workers:
                    worker.sock.sendall(frame)
            logits = run_local()
        except Exception as exc:
            raise self._failed(exc) from exc
        self.check_health()  # a non-blocking waitpid per worker: a few µs
        return logits

    def check_health(self) -> None:
        """Raise ``ExecutorFailedError`` if a worker exited or reported a failure."""
        if self._failure is None and all(w.is_alive() for w in self.workers):
            return
        raise self._failed(None)

    def _failed(self, exc: BaseException | None) -> ExecutorFailedError:
        """The group is broken: what each rank says about it, in one error (kept, so every
        later step fails the same way)."""
        if self._failure is None:
            deadline = time.monotonic() + FAILURE_REPORT_S
            for worker in self.workers:
                worker.read_report(max(deadline - time.monotonic(), 0))
                if worker.report is None:
                    worker.join(max(deadline - time.monotonic(), 0))
            causes = [d for w in self.workers if (d := w.describe()) is not None]
            if not causes and exc is not None:
                causes = [f"tensor-parallel rank 0 failed: {exc!r}"]
            self._failure = "; ".join(causes) or "the tensor-parallel group broke"
            log.error("the executor failed: %s", self._failure)
        return ExecutorFailedError(self._failure)

    def shutdown(self) -> None:
        """Stop every worker (asked, then killed after ``JOIN_TIMEOUT_S``) and reap it."""
        if self._stopped:
            return
        self._stopped = True
        for worker in self.workers:
            try:
                worker.sock.settimeout(JOIN_TIMEOUT_S)
                messages.send(worker.sock, messages.Shutdown())
            except OSError:
                pass
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for worker in self.workers:
            worker.join(max(deadline - time.monotonic(), 0))
            if worker.process is not None and worker.process.is_alive():
                log.warning("tensor-parallel rank %d did not stop; killing it", worker.rank)
                worker.process.kill()
                worker.process.join()
            worker.sock.close()
        torch.set_num_threads(self._threads_before)
