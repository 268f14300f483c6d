"""The operator's scenarios on a real cluster, with real pods and real traffic (see README.md).

Each scenario prints one line when it passes and raises on the first failure. Traffic goes
through the LLMDeployment's Service by ``kubectl port-forward`` with the OpenAI SDK.
"""

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from openai import OpenAI

T = TypeVar("T")
API = ("kvserve.io", "v1alpha1", "llmdeployments")
OPERATOR_DEPLOYMENT = "kvs-kvserve-operator"


def wait_for(probe: Callable[[], T], what: str, timeout: float = 600.0) -> T:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(2)
    return value


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


class Scenarios:
    def __init__(self, namespace: str, operator_namespace: str, image: str) -> None:
        config.load_kube_config()
        self.ns, self.operator_ns, self.image = namespace, operator_namespace, image
        self.custom = client.CustomObjectsApi()
        self.apps = client.AppsV1Api()
        self.core = client.CoreV1Api()

    def llmd(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*API[:2], self.ns, API[2], name)

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
                "metadata": {"name": name}, "spec": {"image": self.image, **spec}}  # fmt: skip
        kubectl("apply", "-n", self.ns, "-f", "-", stdin=yaml.safe_dump(body))

    def wait_ready(self, name: str, replicas: int) -> dict[str, Any]:
        def ready() -> dict | None:
            status = self.llmd(name).get("status") or {}
            ok = status.get("phase") == "Ready" and status.get("readyReplicas") == replicas
            return status if ok else None

        return wait_for(ready, f"{name} Ready with {replicas} replicas")

    def child_uids(self, name: str) -> dict[str, str]:
        found = {
            "Deployment": self.apps.list_namespaced_deployment(self.ns),
            "Service": self.core.list_namespaced_service(self.ns),
        }
        return {
            f"{kind}/{item.metadata.name}": item.metadata.uid
            for kind, items in found.items()
            for item in items.items
            if (item.metadata.labels or {}).get("kvserve.io/llmdeployment") == name
        }

    @contextlib.contextmanager
    def openai(self, name: str) -> Iterator[OpenAI]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        forward = subprocess.Popen(
            ["kubectl", "port-forward", "-n", self.ns, f"svc/{name}", f"{port}:8000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: _listening(port), "the port-forward", timeout=30)
            yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        finally:
            forward.terminate()
            forward.wait()

    def run(self, name: str = "demo") -> None:
        spec = {
            "model": {"source": "/opt/kvserve/models/demo", "servedName": "demo"},
            "replicas": 1,
            "resources": {"cpu": "1", "memory": "2Gi"},
            "drain": {"timeoutSeconds": 60},
        }
        self.apply(name, spec)
        status = self.wait_ready(name, 1)
        assert status["endpoint"] == f"http://{name}.{self.ns}.svc:8000/v1", status
        print("ok   apply → real pods Ready, status and endpoint")

        with self.openai(name) as ai:
            assert [m.id for m in ai.models.list()] == ["demo"]
            chat = ai.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
            )
            assert chat.choices[0].finish_reason in ("stop", "length"), chat
            chunks = list(
                ai.completions.create(model="demo", prompt="Hi", max_tokens=8, stream=True)
            )
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        print("ok   Service traffic with the OpenAI SDK (chat, streamed completion)")

        kubectl("scale", "llmd", name, "-n", self.ns, "--replicas=2")
        self.wait_ready(name, 2)
        print("ok   kubectl scale → 2 ready replicas")

        self.rollout_cuts_no_stream(name)
        print("ok   spec update → rollout; an in-flight stream finished")

        self.invalid_spec(name)
        print("ok   invalid spec → Degraded condition and Warning Event; fixed again")

        before = self.child_uids(name)
        kubectl("delete", "service", name, "-n", self.ns)
        wait_for(lambda: f"Service/{name}" in self.child_uids(name), "the Service re-created")
        kubectl("rollout", "restart", f"deployment/{OPERATOR_DEPLOYMENT}", "-n", self.operator_ns)
        kubectl("rollout", "status", f"deployment/{OPERATOR_DEPLOYMENT}", "-n", self.operator_ns)
        logs = ("logs", "-n", self.operator_ns, f"deployment/{OPERATOR_DEPLOYMENT}")
        resumed = f"[{self.ns}/{name}] Resuming is processed"
        wait_for(lambda: resumed in kubectl(*logs), "the restarted operator to resume", 120)
        after = self.child_uids(name)
        assert after.keys() == before.keys(), (before, after)
        assert after[f"Deployment/{name}"] == before[f"Deployment/{name}"]
        print("ok   deleted child re-created; operator restart made no duplicates")

        self.hpa_scales_up_under_load("loaded")
        print("ok   HPA scaled up on vllm:num_requests_waiting under load")

        for gone in (name, "loaded"):
            kubectl("delete", "llmd", gone, "-n", self.ns, "--wait=true")
            wait_for(lambda g=gone: not self.child_uids(g), f"{gone}'s children collected")
        print("ok   delete → nothing left behind")

    def rollout_cuts_no_stream(self, name: str) -> None:
        finish: list[str | None] = []

        def stream() -> None:
            with self.openai(name) as ai:
                out = ai.completions.create(
                    model="demo", prompt="Once upon a time", max_tokens=400, stream=True,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                finish.extend(c.choices[0].finish_reason for c in out if c.choices)

        reader = threading.Thread(target=stream)
        reader.start()
        time.sleep(2)
        generation = self.llmd(name)["metadata"]["generation"]
        kubectl("patch", "llmd", name, "-n", self.ns, "--type=merge",
                "-p", json.dumps({"spec": {"engine": {"maxNumSeqs": 8}}}))  # fmt: skip
        wait_for(lambda: self.llmd(name)["status"]["observedGeneration"] > generation, "rollout")
        reader.join(timeout=600)
        assert finish and finish[-1] == "length", finish
        self.wait_ready(name, 2)

    def invalid_spec(self, name: str) -> None:
        patch = {"spec": {"autoscaling": {"minReplicas": 3, "maxReplicas": 1,
                                          "targetWaitingRequests": 1}}}  # fmt: skip
        kubectl("patch", "llmd", name, "-n", self.ns, "--type=merge", "-p", json.dumps(patch))

        def degraded() -> bool:
            conditions = self.llmd(name).get("status", {}).get("conditions", [])
            return any(c["type"] == "Degraded" and c["reason"] == "InvalidSpec" for c in conditions)

        wait_for(degraded, "Degraded")
        events = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name},reason=InvalidSpec"
        ).items
        assert events and events[0].type == "Warning", events
        kubectl("patch", "llmd", name, "-n", self.ns, "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')  # fmt: skip
        self.wait_ready(name, 2)

    def hpa_scales_up_under_load(self, name: str) -> None:
        self.apply(name, {
            "model": {"source": "/opt/kvserve/models/demo", "servedName": "demo"},
            "resources": {"cpu": "1", "memory": "2Gi"},
            "engine": {"maxNumSeqs": 2},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetWaitingRequests": 1,
                            "scaleDownStabilizationSeconds": 60},
        })  # fmt: skip
        self.wait_ready(name, 1)
        stop = threading.Event()

        def load(ai: OpenAI) -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    ai.completions.create(model="demo", prompt="Tell me", max_tokens=256,
                                          extra_body={"ignore_eos": True})  # fmt: skip

        with self.openai(name) as ai:
            workers = [threading.Thread(target=load, args=(ai,)) for _ in range(24)]
            for w in workers:
                w.start()
            try:
                wait_for(lambda: (self.llmd(name).get("status") or {}).get("replicas", 0) > 1,
                         "the HPA to add a replica", timeout=900)  # fmt: skip
            finally:
                stop.set()
                for w in workers:
                    w.join()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--namespace", default="kvserve-e2e")
    parser.add_argument("--operator-namespace", default="kvserve-system")
    parser.add_argument("--image", default="kvserve:dev")
    args = parser.parse_args()
    Scenarios(args.namespace, args.operator_namespace, args.image).run()
    print("all e2e scenarios passed")


if __name__ == "__main__":
    sys.exit(main())
