"""Two engine processes as two nodes on 127.0.0.1 (gloo): the leader (node 0, this process:
engine core and rank 0) and a headless node (``kvserve serve --headless``, node 1) give the
greedy tokens of one process and of transformers, with tensor parallelism across the two or
pipeline stages one per node; a node that never arrives is named in an error at the
rendezvous timeout, and a node killed mid-stream turns the leader dead at once."""

import os
import signal
import subprocess
import time

import pytest
from test_executor_faults import step_until_dead
from two_nodes import free_port, headless_args, headless_node, leader_config

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.executor import ExecutorFailedError
from kvserve.engine.executor.multiproc import MultiprocExecutor
from kvserve.engine.llm_engine import EngineDeadError, LLMEngine

from reference import assert_greedy_match, hf_greedy

PROMPTS = {"a": [5, 9, 33, 70, 12, 8, 400], "b": [100, 200, 300, 510], "c": [7, 7, 1]}
MAX_TOKENS = 12


def greedy(engine: LLMEngine) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, params)
    tokens: dict[str, list[int]] = {r: [] for r in PROMPTS}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
    return tokens


@pytest.mark.parametrize(
    ("tp", "pp"), [(2, 1), (1, 2), (2, 2)], ids=["tp2-across", "pp2-across", "tp2xpp2"]
)
def test_two_nodes_give_one_process_and_transformers_tokens(checkpoint, tp, pp):
    path = checkpoint("llama")
    one = LLMEngine(EngineConfig(model=str(path), dtype="float32", num_kv_blocks=32))
    try:
        want = greedy(one)
    finally:
        one.shutdown()
    config = leader_config(
        path, free_port(), num_kv_blocks=32, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    with headless_node(config) as node:
        engine = LLMEngine(config)
        executor = engine.runner
        assert isinstance(executor, MultiprocExecutor)
        local = tp * pp // 2
        assert len(executor.pids) == local - 1  # the leader's own workers
        assert [w.rank for w in executor.workers] == list(range(1, tp * pp))
        try:
            got = greedy(engine)
        finally:
            engine.shutdown()
        assert node.wait(30) == 0  # the leader's shutdown ends the headless node
    assert got == want
    for request_id, prompt in PROMPTS.items():
        expected = hf_greedy(str(path), prompt, MAX_TOKENS)
        assert_greedy_match(str(path), prompt, expected, got[request_id])


def test_a_node_that_never_arrives_is_named_at_the_rendezvous_timeout(checkpoint):
    port = free_port()
    config = leader_config(
        checkpoint("llama"),
        port,
        num_kv_blocks=32,
        tensor_parallel_size=2,
        distributed_timeout_seconds=2,
    )
    start = time.monotonic()
    with pytest.raises(ExecutorFailedError) as info:
        LLMEngine(config)
    assert time.monotonic() - start < 10
    assert str(info.value) == (
        f"node rank 1 (ranks 1) never arrived at the rendezvous at 127.0.0.1:{port} within "
        "2 s (--master-addr, --master-port, --distributed-timeout-seconds)"
    )


def test_a_node_killed_mid_stream_turns_the_leader_dead_at_once(checkpoint):
    config = leader_config(
        checkpoint("llama"), free_port(), num_kv_blocks=32, tensor_parallel_size=2
    )
    with headless_node(config) as node:
        engine = LLMEngine(config)
        try:
            params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
            engine.add_request("a", "def f(x):", params)
            for _ in range(3):
                engine.step()
            os.kill(node.pid, signal.SIGKILL)
            error = step_until_dead(engine, within=5)
            assert "rank 1 (node 1 at 127.0.0.1) is gone: its connection closed" in str(error)
            with pytest.raises(EngineDeadError):
                engine.check_health()
        finally:
            engine.shutdown()


def test_a_headless_node_whose_leader_never_comes_exits_naming_the_rendezvous(checkpoint):
    port = free_port()
    config = leader_config(checkpoint("llama"), port, num_kv_blocks=32, tensor_parallel_size=2)
    argv = [*headless_args(config), "--distributed-timeout-seconds", "2"]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60
    assert done.returncode == 1
    assert (
        f"RuntimeError: rank 1: the leader's rendezvous at 127.0.0.1:{port} did not answer "
        "within 2 s" in done.stderr
    ), done.stderr
