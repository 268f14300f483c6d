"""Tensor parallelism over processes: rank 0 in the engine's process, ranks 1..N-1 in
worker processes (``worker.py``).

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
from kvserve.engine.executor import messages
from kvserve.engine.executor.distributed import free_port, process_group, rendezvous_store
from kvserve.engine.executor.model_runner import ModelRunner, StepInputs
from kvserve.engine.executor.worker import WorkerSpec, run_worker
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
    def __init__(self, rank: int, process: BaseProcess, sock: socket.socket) -> None:
        self.rank = rank
        self.process = process
        self.sock = sock
        self.report: str | None = None  # what it said when it failed

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
            pass

    def describe(self) -> str | None:
        """How this worker failed, or None while it runs and said nothing."""
        if self.report is not None:
            return f"tensor-parallel rank {self.rank} failed: {self.report}"
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
        size = config.tensor_parallel_size
        self.step_timeout_s = step_timeout_s = STEP_TIMEOUT_S
        self.workers: list[_Worker] = []
        self._failure: str | None = None
        self._stopped = False
        self._threads_before = torch.get_num_threads()
        threads = max(1, self._threads_before // size)
        if plan.device.type == "cpu":
            torch.set_num_threads(threads)
        port = free_port()
        startup_timeout = timedelta(seconds=STARTUP_TIMEOUT_S)
        store = rendezvous_store(port, 0, size, startup_timeout)
        context = multiprocessing.get_context("spawn")
        try:
            for rank in range(1, size):
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
            group = process_group(store, 0, size, plan.device, startup_timeout)
            tp = TensorParallel(0, size, group)
            try:
                self.runner = ModelRunner(config, model_config, plan, progress, startup, tp)
            except Exception as exc:
                raise self._failed(exc) from exc
            self._await(messages.Ready, STARTUP_TIMEOUT_S, "did not load the model")
            group._set_default_timeout(timedelta(seconds=step_timeout_s))
            for worker in self.workers:
                worker.sock.settimeout(step_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        self.plan = self.runner.plan
        self.store = store  # the group's rendezvous: kept for the group's lifetime

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process.pid is not None]

    def _await(self, kind: type, timeout: float, what: str) -> None:
        """Every worker's next message is a ``kind`` within ``timeout``, else an error that
        names the first rank that failed, exited or stayed silent."""
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            left = deadline - time.monotonic()
            waits: list[socket.socket | int] = [worker.sock, worker.process.sentinel]
            if not multiprocessing.connection.wait(waits, max(left, 0)):
                raise ExecutorFailedError(
                    f"tensor-parallel rank {worker.rank} {what} within {timeout:.0f} s"
                )
            try:
                message = messages.receive(worker.sock)
            except (OSError, EOFError):
                worker.process.join(FAILURE_REPORT_S)
                message = None
            if isinstance(message, messages.Failed):
                worker.report = message.error.strip().splitlines()[-1]
                log.error("tensor-parallel rank %d failed:\n%s", worker.rank, message.error)
            if not isinstance(message, kind):
                worker.process.join(FAILURE_REPORT_S)
                raise ExecutorFailedError(worker.describe() or f"rank {worker.rank}: {message}")

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Prepare the step, send it to every worker, run rank 0's part; the logits."""
        return self.run(self.prepare(out))

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """The step's inputs (rank 0's ``ModelRunner.prepare``)."""
        return self.runner.prepare(out)

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Send prepared inputs to every worker and run rank 0's part; the logits."""
        if self._failure is not None:
            raise ExecutorFailedError(self._failure)
        try:
            frame = messages.frame(messages.Step.of(inputs))
            for worker in self.workers:
                worker.sock.sendall(frame)
            logits = self.runner.run(inputs)
        except Exception as exc:
            raise self._failed(exc) from exc
        self.check_health()  # a non-blocking waitpid per worker: a few µs
        return logits

    def check_health(self) -> None:
        """Raise ``ExecutorFailedError`` if a worker exited or reported a failure."""
        if self._failure is None and all(w.process.is_alive() for w in self.workers):
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
                    worker.process.join(max(deadline - time.monotonic(), 0))
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
            worker.process.join(max(deadline - time.monotonic(), 0))
            if worker.process.is_alive():
                log.warning("tensor-parallel rank %d did not stop; killing it", worker.rank)
                worker.process.kill()
                worker.process.join()
            worker.sock.close()
        torch.set_num_threads(self._threads_before)
