"""A served engine keeps one OpenMP team: its loading and warm-up leave no second team of
workers on a thread that outlives them (with two, GNU OpenMP throttles both teams' spin-wait
and every step waits on its workers' wake-ups; see ``build_engine``)."""

import subprocess
import sys

import pytest

NUM_THREADS = 2
# In a fresh process: build the engine as asked, serve one request through AsyncLLM, then
# print how many threads the engine added that are not Python threads (OpenMP's workers).
SCRIPT = f"""
import asyncio, os, sys, threading
import torch
torch.set_num_threads({NUM_THREADS})
from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.engine_builder import build_engine
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams


def native_threads():
    python = {{t.native_id for t in threading.enumerate()}}
    return len([tid for tid in os.listdir("/proc/self/task") if int(tid) not in python])


async def serve_one(engine):
    llm = AsyncLLM(engine)
    llm.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        async for _ in llm.generate(list(range(1, 200)), params, "r"):
            pass
        return native_threads()
    finally:
        llm.shutdown()


before = native_threads()
config = EngineConfig(model=sys.argv[1], num_kv_blocks=64)
engine = build_engine(config) if sys.argv[2] == "build_engine" else LLMEngine(config)
print(asyncio.run(serve_one(engine)) - before)
"""


def _openmp_workers(checkpoint, how: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(checkpoint("llama")), how],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(result.stdout.split()[-1])


@pytest.mark.parametrize(
    ("how", "workers"),
    [
        # The engine thread's team alone: its master plus NUM_THREADS - 1 workers.
        ("build_engine", NUM_THREADS - 1),
        # Built on the main thread, which lives on: a second team beside the engine thread's.
        ("main_thread", 2 * (NUM_THREADS - 1)),
    ],
)
def test_a_served_engine_leaves_one_openmp_team(checkpoint, how, workers):
    assert _openmp_workers(checkpoint, how) == workers
