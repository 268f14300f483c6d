"""The multi-node layout is checked once, as the settings are read: the nodes must split the
world size evenly, the node rank must be one of them, and only a worker node runs headless;
``kvserve serve --headless`` says so and starts nothing."""

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.server.cli import main


def test_the_world_is_tensor_times_pipeline_ranks_spread_evenly_over_the_nodes():
    config = EngineConfig(model="/m", tensor_parallel_size=2, pipeline_parallel_size=2, nnodes=2)
    assert (config.world_size, config.local_world_size) == (4, 2)
    assert config.distributed_executor_backend == "mp"
    assert EngineConfig(model="/m", pipeline_parallel_size=2).distributed_executor_backend == "mp"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            dict(tensor_parallel_size=2, pipeline_parallel_size=2, nnodes=3),
            "nnodes 3 must divide the world size tensor_parallel_size 2 x "
            "pipeline_parallel_size 2 = 4",
        ),
        (
            dict(tensor_parallel_size=2, nnodes=2, node_rank=2, headless=True),
            "node_rank 2 is out of range for nnodes 2 (0..1)",
        ),
        (
            dict(tensor_parallel_size=2, nnodes=2, headless=True),
            "headless runs a worker node's ranks; node_rank 0 is the leader, which runs the "
            "API server and the engine: give headless a node_rank from 1 to nnodes - 1",
        ),
        (
            dict(tensor_parallel_size=2, nnodes=2, node_rank=1),
            "node_rank 1 is a worker node: run it with headless (only node_rank 0 runs the "
            "API server and the engine)",
        ),
        (
            dict(pipeline_parallel_size=2, distributed_executor_backend="uni"),
            "distributed_executor_backend uni runs one rank, not tensor_parallel_size 1 x "
            "pipeline_parallel_size 2; use mp",
        ),
        (
            dict(pipeline_parallel_size=2, enable_lora=True),
            "enable_lora is not supported with pipeline_parallel_size > 1",
        ),
        (
            dict(tensor_parallel_size=2, nnodes=2, distributed_timeout_seconds=0),
            "distributed_timeout_seconds must be > 0, got 0",
        ),
        (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be >= 1, got 0"),
        (dict(nnodes=0), "nnodes must be >= 1, got 0"),
    ],
)
def test_a_layout_the_nodes_cannot_run_is_refused_by_name(settings, message):
    with pytest.raises(ValueError) as info:
        EngineConfig(model="/m", **settings)
    assert str(info.value) == message


def test_headless_on_the_leader_stops_the_cli_with_the_reason():
    argv = ["serve", "--headless", "--model", "/m", "--tensor-parallel-size", "2"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--nnodes", "2", "--node-rank", "0"])
    assert str(info.value).startswith("kvserve: headless runs a worker node's ranks")
