"""``kvserve serve`` as the leader of two nodes (API server, engine core, rank 0) with
``kvserve serve --headless`` as node 1: completions come back as one process gives them, and
when the leader dies the headless node ends with it, leaving no rank behind."""

import os
import signal
import time

from test_server_tp import workers
from two_nodes import free_port, headless_node, leader_config

from kvserve import LLM, SamplingParams

from faults import gone
from server_process import ServerProcess

PROMPT = "def f(x):"


def test_the_leader_serves_with_a_headless_node_which_ends_with_it(checkpoint, tmp_path):
    path = checkpoint("llama")
    single = LLM(str(path), dtype="float32", num_kv_blocks=32)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        want = single.generate(PROMPT, params)[0].outputs[0].text
    finally:
        single.engine.shutdown()
    config = leader_config(path, free_port(), num_kv_blocks=32, tensor_parallel_size=2)
    flags = [
        "--dtype", "float32", "--num-kv-blocks", "32", "--tensor-parallel-size", "2",
        "--nnodes", "2", "--master-port", str(config.master_port),
    ]  # fmt: skip
    with headless_node(config) as node:
        with ServerProcess(path, *flags, log=tmp_path / "leader.log") as server:
            assert server.process is not None
            ranks = workers(node.pid)
            assert len(ranks) == 1 and workers(server.process.pid) == []
            body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
            reply = server.post("/v1/completions", body | {"ignore_eos": True})
            assert reply["choices"][0]["text"] == want
            os.kill(server.process.pid, signal.SIGKILL)
            start = time.monotonic()
            node.wait(15)
            assert time.monotonic() - start < 15
        assert all(gone(pid) for pid in ranks)
