"""An ``LLMEngine`` built on a thread of its own, for the engine thread of an ``AsyncLLM``."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine


def build_engine(
    config: EngineConfig, progress: Callable[[int, int], None] | None = None
) -> LLMEngine:
    """An ``LLMEngine`` for an ``AsyncLLM``, built on a thread of its own that ends once the
    engine is built (its errors are raised here).

    GNU OpenMP, torch's CPU threads, keeps a team of worker threads for each thread that ran
    a parallel op, for as long as that thread lives, and once a process has more OpenMP
    threads than CPUs it cuts every team's spin-wait from 300,000 spins to 100: the workers
    then sleep between the ops of a step and each op waits for their wake-up. Built on the
    main thread, the engine left such a team there beside the engine thread's own, and
    served decode steps took ~20% longer (benchmarks/cpu-levers.md, "Item 3"). A thread
    that ends frees its team.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="kvserve-engine-build") as builder:
        return builder.submit(LLMEngine, config, progress).result()
