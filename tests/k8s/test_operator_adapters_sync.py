"""Which adapter calls a pod gets, and the status the pods' answers make."""

import base64
import json
import socket
import sys
import urllib.request
from pathlib import Path

from k8s.loopback_api import answering
from k8s.support import ROOT
from kvserve.operator.adapter_status import adapter_report
from kvserve.operator.adapter_sync import (
    PodSync,
    pod_address,
    served_adapters,
    sync_plan,
    sync_pod,
)
from kvserve.operator.kube import Kube
from kvserve.operator.spec import AdapterSpec
from kvserve.server.cli import DEFAULT_MODEL

from server_process import API_KEY, ServerProcess

sys.path.insert(0, str(ROOT / "e2e"))
from make_adapters import main

DEMO, DEMO_NAME = DEFAULT_MODEL, "tiny"
"""The demo model, served under the name ``ServerProcess`` gives a model."""

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
        frozenset(), {"pirate": "not reachable: [Errno 111] Connection refused"}, answered=False
    )


def greedy(url: str, model: str, api_key: str | None = None) -> str:
    body = {"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request) as answer:
        reply = json.load(answer)
    assert reply["model"] == model
    return reply["choices"][0]["text"]


def test_a_real_server_is_brought_to_the_list(tmp_path: Path) -> None:
    """``kvserve serve`` as a pod with adapters runs it: the first sync loads both, a second
    changes nothing, the next one unloads the one dropped and loads the one added, and each
    answers its own way through one adapter slot; an adapter whose files are missing fails
    with the server's refusal, the others stay served."""
    main([str(DEMO), str(tmp_path), "pirate", "poet", "sage"])
    paths = {n: str(tmp_path / n) for n in ("pirate", "poet", "sage")}
    log = tmp_path / "server.log"
    env = ["--device", "cpu", "--enable-lora", "--allow-runtime-lora-updating"]
    with ServerProcess(DEMO, *env, log=log, api_key=None) as server:  # one adapter slot
        address = server.url.removeprefix("http://")
        first = {n: paths[n] for n in ("pirate", "poet")}
        loaded = sync_pod(address, DEMO_NAME, first)
        assert loaded == PodSync(frozenset(first), {}), loaded.failed
        assert sync_pod(address, DEMO_NAME, first) == PodSync(frozenset(first), {})
        second = {n: paths[n] for n in ("pirate", "sage")}
        assert sync_pod(address, DEMO_NAME, second) == PodSync(frozenset(second), {})
        with urllib.request.urlopen(f"{server.url}/v1/models") as answer:
            models = json.load(answer)
        assert served_adapters(models, DEMO_NAME) == second
        answers = {m: greedy(server.url, m) for m in (DEMO_NAME, "pirate", "sage", "pirate")}
        assert len(set(answers.values())) == 3, answers
        missing = {"bard": str(tmp_path / "bard")}
        refused = sync_pod(address, DEMO_NAME, {**second, **missing})
        assert refused.served == frozenset(second)
        assert refused.failed == {
            "bard": f"HTTP 400: LoRA adapter 'bard': no such directory '{tmp_path / 'bard'}'"
        }


def test_a_pod_started_with_an_api_key_is_synced_with_that_key(tmp_path: Path) -> None:
    """A pod started with ``apiKeySecret`` wants its key on every call: with it the adapter
    loads and a second sync only reads the list; with another key or none, the server's own
    401 is what the adapter's state quotes (the pod did answer, so its gate opens)."""
    main([str(DEMO), str(tmp_path), "pirate"])
    wanted = {"pirate": str(tmp_path / "pirate")}
    args = ["--device", "cpu", "--enable-lora", "--allow-runtime-lora-updating"]
    with ServerProcess(DEMO, *args, log=tmp_path / "server.log") as server:
        address = server.url.removeprefix("http://")
        refused = PodSync(frozenset(), {"pirate": "HTTP 401: missing or invalid API key"})
        assert sync_pod(address, DEMO_NAME, wanted) == refused
        assert sync_pod(address, DEMO_NAME, wanted, "not-the-key") == refused
        assert sync_pod(address, DEMO_NAME, wanted, API_KEY) == PodSync(frozenset(wanted), {})
        assert sync_pod(address, DEMO_NAME, wanted, API_KEY) == PodSync(frozenset(wanted), {})
        assert greedy(server.url, "pirate", API_KEY) != greedy(server.url, DEMO_NAME, API_KEY)


def test_the_operator_reads_the_key_of_api_key_secret() -> None:
    secret = {"kind": "Secret", "apiVersion": "v1"}
    secret["data"] = {"token": base64.b64encode(b"s3cret key").decode()}
    with answering({"/api/v1/namespaces/ml/secrets/serving-key": secret}) as api:
        kube = Kube(api)
        assert kube.secret_value("ml", "serving-key", "token") == "s3cret key"
        assert kube.secret_value("ml", "serving-key", "other") is None
        assert kube.secret_value("ml", "missing", "token") is None


def test_only_live_pods_whose_server_is_ready_with_an_ip_are_synced() -> None:
    ready = {
        "metadata": {"name": "p"},
        "status": {
            "podIP": "10.244.0.7",
            "conditions": [{"type": "ContainersReady", "status": "True"}],
        },
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
