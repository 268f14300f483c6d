"""The executor: ModelRunner and the worker processes; the only code that knows how many
devices and ranks there are.

``build_executor`` gives the engine what runs its steps: with one rank (``uni``) the
``ModelRunner`` itself, in the engine's process, on the engine thread (no worker, no extra
cost); with several (``mp``) a ``MultiprocExecutor``: rank 0 still in the engine's process
(the scheduler, KV manager and sampler stay where they are and the logits never cross a
process boundary), ranks 1..N-1 in worker processes. Both answer ``execute(out)`` (logits),
``plan``, ``check_health()`` and ``shutdown()``.

N = tensor_parallel_size x pipeline_parallel_size (``distributed.py``: rank r is
tensor-parallel rank r % tp of stage r // tp). Across ``nnodes`` nodes the leader (node 0)
runs the engine and its ``N / nnodes`` local ranks; every other node is headless
(``headless.py``): its ranks meet the leader's rendezvous and take their steps over TCP
(``node_link.py``).
"""

from collections.abc import Callable

from kvserve.engine.config import EngineConfig
from kvserve.engine.execution_plan import ExecutionPlan
from kvserve.engine.executor.model_runner import ModelRunner
from kvserve.engine.executor.multiproc import ExecutorFailedError, MultiprocExecutor
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.startup import StartupPhases

Executor = ModelRunner | MultiprocExecutor

__all__ = ["Executor", "ExecutorFailedError", "build_executor"]


def build_executor(
    config: EngineConfig,
    model_config: ModelConfig,
    plan: ExecutionPlan,
    progress: Callable[[int, int], None] | None = None,
    startup: StartupPhases | None = None,
) -> Executor:
    if config.distributed_executor_backend == "uni":
        return ModelRunner(config, model_config, plan, progress, startup)
    return MultiprocExecutor(config, model_config, plan, progress, startup)
