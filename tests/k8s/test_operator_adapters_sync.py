"""Which adapter calls a pod gets, and the status the pods' answers make."""

import socket
from pathlib import Path

from kvserve.operator.adapter_status import adapter_report
from kvserve.operator.adapter_sync import (
    PodSync,
    pod_address,
    served_adapters,
    sync_plan,
    sync_pod,
)
from kvserve.operator.spec import AdapterSpec

from server_process import ServerProcess

PIRATE = AdapterSpec(name="pirate", source="/opt/kvserve/adapters/pirate")
POET = AdapterSpec(name="poet", source="pvc://loras/poet")


def test_served_adapters_are_the_models_children_by_path() -> None:
    models = {
        "object": "list",
        "data": [
            {"id": "demo", "object": "model", "root": "/opt/kvserve/models/demo", "parent": None},
            {"id": "pirate", "object": "model", "root": "/a/pirate", "parent": "demo"},
            {"id": "other", "object": "model", "root": "/a/other", "parent": "not-ours"},
        ],
    }
    assert served_adapters(models, "demo") == {"pirate": "/a/pirate"}


def test_plan_unloads_the_unwanted_and_the_moved_then_loads_what_is_missing() -> None:
    wanted = {"poet": "/b/poet", "sage": "/a/sage", "pirate": "/a/pirate"}
    served = {"pirate": "/a/pirate", "poet": "/old/poet", "bard": "/a/bard"}
    assert sync_plan(wanted, served) == (["bard", "poet"], ["poet", "sage"])
    assert sync_plan(wanted, wanted) == ([], [])


def test_a_pod_that_does_not_answer_fails_every_wanted_adapter() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = sync_pod(f"127.0.0.1:{port}", "demo", {"pirate": "/a/pirate"})
    assert result == PodSync(
        frozenset(), {"pirate": "not reachable: [Errno 111] Connection refused"}
    )


def test_a_server_that_wants_an_api_key_refuses_the_operator_by_its_own_message(
    tmp_path: Path,
) -> None:
    """The operator holds no Secret: a pod started with ``apiKeySecret`` answers 401, which the
    adapter's state quotes."""
    with ServerProcess(None, "--device", "cpu", log=tmp_path / "server.log") as server:
        result = sync_pod(f"127.0.0.1:{server.port}", "kvserve-demo", {"pirate": "/a/pirate"})
    assert result == PodSync(frozenset(), {"pirate": "HTTP 401: missing or invalid API key"})


def test_only_ready_live_pods_with_an_ip_are_synced() -> None:
    ready = {
        "metadata": {"name": "p"},
        "status": {"podIP": "10.244.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert pod_address(ready) == "10.244.0.7:8000"
    not_ready = {**ready, "status": {**ready["status"], "conditions": []}}
    going = {**ready, "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert pod_address(not_ready) is None
    assert pod_address(going) is None


def test_every_pod_serving_every_adapter_is_ready() -> None:
    both = PodSync(frozenset({"pirate", "poet"}), {})
    entries, condition = adapter_report([PIRATE, POET], {"a": both, "b": both})
    assert entries == [
        {
            "name": "pirate",
            "source": "/opt/kvserve/adapters/pirate",
            "state": "Loaded",
            "message": "served by 2/2 Ready pods",
        },
        {
            "name": "poet",
            "source": "pvc://loras/poet",
            "state": "Loaded",
            "message": "served by 2/2 Ready pods",
        },
    ]
    assert condition == (True, "Loaded", "2 adapters loaded on 2 Ready pods")


def test_a_failure_on_one_pod_fails_the_adapter_and_names_the_pod() -> None:
    pods = {
        "b": PodSync(frozenset({"pirate"}), {"poet": "HTTP 404: adapter path /x not found"}),
        "a": PodSync(frozenset({"pirate", "poet"}), {}),
    }
    entries, condition = adapter_report([PIRATE, POET], pods)
    assert [(e["state"], e["message"]) for e in entries] == [
        ("Loaded", "served by 2/2 Ready pods"),
        ("Failed", "1/2 pods failed; b: HTTP 404: adapter path /x not found"),
    ]
    assert condition == (
        False,
        "AdapterLoadFailed",
        "adapter poet: 1/2 pods failed; b: HTTP 404: adapter path /x not found",
    )


def test_no_ready_pod_is_loading() -> None:
    entries, condition = adapter_report([PIRATE], {})
    assert entries[0]["state"] == "Loading"
    assert entries[0]["message"] == "served by 0/0 Ready pods"
    assert condition == (None, "Loading", "not yet on every Ready pod: pirate")
