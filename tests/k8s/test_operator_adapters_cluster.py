"""``spec.adapters`` and ``status.adapters`` on a real kube-apiserver (v1.20) with the operator
as the chart installs it: what the CRD's schema refuses, what the status keeps."""

import json
import sys
import urllib.request
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from k8s.cluster_objects import apply_yaml, condition, events_for, llmd, namespace, play_node
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, ROOT, load_sample
from kvserve.operator.kube import Kube
from kvserve.operator.resource import HTTP_PORT
from kvserve.server.cli import DEFAULT_MODEL

from server_process import ServerProcess

sys.path.insert(0, str(ROOT / "e2e"))
from make_adapters import main as make_adapters

pytestmark = NEEDS_CLUSTER


def test_the_api_server_refuses_a_repeated_or_malformed_adapter_name(
    plane: ControlPlane, operator: Operator
) -> None:
    ns = namespace(plane, "adapter-names")
    body = load_sample("cpu-demo.yaml")
    for adapters, refusal in (
        (
            [{"name": "pirate", "source": "/a"}, {"name": "pirate", "source": "/b"}],
            'spec.adapters[1]: Duplicate value: map[string]interface {}{"name":"pirate"}',
        ),
        (
            [{"name": "Pirate", "source": "/a"}],
            'spec.adapters.name: Invalid value: "Pirate": spec.adapters.name in body should '
            "match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
        ),
    ):
        body["spec"]["adapters"] = adapters
        applied = plane.kubectl(
            "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(body), check=False
        )
        assert applied.returncode != 0
        assert refusal in applied.stderr, applied.stderr


def test_a_spec_without_adapters_clears_the_status_adapters(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    ns = namespace(plane, "adapters-cleared")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded"), "the first status")
    shown = [{"name": "pirate", "source": "/a", "state": "Loaded", "message": "served by 2/2"}]

    # As an earlier spec's status left it; the server's answer shows the schema keeps it (the
    # operator may clear it at once, on any status refresh).
    def patched() -> dict | None:
        try:
            return kube.patch_status(llmd(kube, ns, "cpu-demo"), {"adapters": shown})
        except ApiException as e:
            if e.status != 409:  # the operator wrote in between: read again
                raise
            return None

    assert wait_for(patched, "the status patched")["status"]["adapters"] == shown
    plane.kubectl(
        "patch", "llmd", "cpu-demo", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}'
    )
    cleared = wait_for(
        lambda: (b := llmd(kube, ns, "cpu-demo"))["status"].get("observedGeneration") == 2 and b,
        "the next generation's status",
    )
    assert "adapters" not in cleared["status"]
    assert condition(cleared, "AdaptersReady") is None


POD_IP = "127.0.0.77"
"""The played pod's IP: a loopback address of this host, where a real server listens on the
pods' port."""


def _shown(kube: Kube, ns: str, generation: int) -> dict | None:
    """The status once it is for ``generation`` and says ``AdaptersReady``."""
    body = llmd(kube, ns, "cpu-demo")
    if body["status"].get("observedGeneration") != generation:
        return None
    ready = condition(body, "AdaptersReady")
    return body if ready is not None and ready["reason"] != "Loading" else None


def test_adapters_reach_the_running_pod_without_a_rollout_and_a_failure_is_one_event(
    plane: ControlPlane, operator: Operator, kube: Kube, tmp_path: Path
) -> None:
    ns = namespace(plane, "adapters-live")
    make_adapters([str(DEFAULT_MODEL), str(tmp_path), "pirate", "poet", "sage"])
    body = load_sample("cpu-demo.yaml")
    body["spec"].update(replicas=1, adapters=[
        {"name": n, "source": str(tmp_path / n)} for n in ("pirate", "poet")
    ])  # fmt: skip
    body["spec"]["model"]["servedName"] = "tiny"  # as ServerProcess names the model
    flags = ["--device", "cpu", "--enable-lora", "--allow-runtime-lora-updating"]
    with ServerProcess(
        DEFAULT_MODEL, *flags, "--max-cpu-loras", "4", log=tmp_path / "server.log",
        api_key=None, address=(POD_IP, HTTP_PORT),
    ) as server:  # fmt: skip
        apply_yaml(plane, ns, body)
        wait_for(lambda: play_node(plane, ns, "cpu-demo") == 1, "the pod")
        core = client.CoreV1Api(plane.admin_client())
        (pod,) = core.list_namespaced_pod(ns).items
        assert pod.spec.readiness_gates[0].condition_type == "kvserve.io/adapters-synced"
        server_ready = {"type": "ContainersReady", "status": "True"}
        played = {"status": {"podIP": POD_IP, "conditions": [server_ready]}}
        core.patch_namespaced_pod_status(pod.metadata.name, ns, played)
        first = wait_for(lambda: _shown(kube, ns, 1), "the adapters' status")
        gate = wait_for(
            lambda: next(
                (c for c in core.read_namespaced_pod(pod.metadata.name, ns).status.conditions
                 if c.type == "kvserve.io/adapters-synced"), None,
            ),
            "the readiness gate's condition",
        )  # fmt: skip
        assert gate.status == "True"
        assert first["status"]["adapters"] == [
            {"name": n, "source": str(tmp_path / n), "state": "Loaded",
             "message": "served by 1/1 Ready pods"}
            for n in ("pirate", "poet")
        ]  # fmt: skip
        deployment = kube.get("apps/v1", "Deployment", ns, "cpu-demo")

        body["spec"]["adapters"].append({"name": "sage", "source": str(tmp_path / "sage")})
        apply_yaml(plane, ns, body)
        second = wait_for(lambda: _shown(kube, ns, 2), "the third adapter's status")
        assert [(a["name"], a["state"]) for a in second["status"]["adapters"]] == [
            ("pirate", "Loaded"), ("poet", "Loaded"), ("sage", "Loaded")
        ]  # fmt: skip
        ready = condition(second, "AdaptersReady")
        assert (ready["status"], ready["message"]) == ("True", "3 adapters loaded on 1 Ready pods")
        with urllib.request.urlopen(f"{server.url}/v1/models") as answer:
            served = [m["id"] for m in json.load(answer)["data"]]
        assert served == ["tiny", "pirate", "poet", "sage"]
        after = kube.get("apps/v1", "Deployment", ns, "cpu-demo")
        assert after["metadata"]["generation"] == deployment["metadata"]["generation"]
        assert [p.metadata.uid for p in core.list_namespaced_pod(ns).items] == [pod.metadata.uid]

        body["spec"]["adapters"].append({"name": "bard", "source": str(tmp_path / "bard")})
        apply_yaml(plane, ns, body)
        third = wait_for(lambda: _shown(kube, ns, 3), "the failed adapter's status")
        failed = condition(third, "AdaptersReady")
        bard = third["status"]["adapters"][-1]
        assert (bard["name"], bard["state"]) == ("bard", "Failed")
        refusal = f"HTTP 400: LoRA adapter 'bard': no such directory '{tmp_path / 'bard'}'"
        assert bard["message"] == f"1/1 pods failed; {pod.metadata.name}: {refusal}"
        assert (failed["status"], failed["reason"], failed["message"]) == (
            "False", "AdapterLoadFailed", f"adapter bard: {bard['message']}"
        )  # fmt: skip
        event = wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event")
        assert event == [
            {"type": "Warning", "reason": "AdapterLoadFailed", "message": failed["message"]}
        ]
