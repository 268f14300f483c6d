"""The cluster as the e2e scenarios see it: kubectl, helm, the API, and HTTP access to pods.

Two ways to reach a Service or a pod over HTTP:
- ``clusterip``: straight to the Service's ClusterIP (through kube-proxy) and to the pod IP, as
  from any machine that routes the cluster's networks (the project's real node does);
- ``port-forward``: ``kubectl port-forward`` per connection, for clusters whose networks the
  client cannot route (kind on Docker). A port-forward to a Service sticks to one pod, so what
  proves load balancing needs ``clusterip``.
"""

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from kubernetes import client, config

T = TypeVar("T")
Access = Literal["clusterip", "port-forward"]
COMMAND_TIMEOUT = 300.0
HELM_TIMEOUT = 420.0
"""Longer than the 5 minutes the scenarios give ``helm --wait``, so that helm reports first."""
_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+)")


def wait_for(probe: Callable[[], T], what: str, timeout: float, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Cluster:
    kubeconfig: Path | None = None
    """None: kubectl's and the client's own defaults ($KUBECONFIG, ~/.kube/config)."""
    kubectl_bin: str = "kubectl"
    helm_bin: str = "helm"
    helm_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    access: Access = "clusterip"

    def __post_init__(self) -> None:
        api = config.new_client_from_config(str(self.kubeconfig) if self.kubeconfig else None)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def _config_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True,
        timeout: float = COMMAND_TIMEOUT,
    ) -> str:  # fmt: skip
        """kubectl's stdout; a failure raises with its stderr."""
        done = subprocess.run(
            [self.kubectl_bin, *self._config_args(), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def helm(self, *args: str) -> str:
        done = subprocess.run(
            [self.helm_bin, *self._config_args(), *args],
            capture_output=True, text=True, env=self.helm_env, timeout=HELM_TIMEOUT,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def helm_major(self) -> int:
        """The helm client's major version (``v4.1.4`` → 4)."""
        return int(self.helm("version", "--template", "{{.Version}}").lstrip("v").split(".")[0])

    @contextlib.contextmanager
    def service_url(self, namespace: str, name: str, port: int) -> Iterator[str]:
        """``http://HOST:PORT`` of the Service for the duration of the block."""
        if self.access == "clusterip":
            ip = self.core.read_namespaced_service(name, namespace).spec.cluster_ip
            yield f"http://{ip}:{port}"
        else:
            with self._port_forward(namespace, f"svc/{name}", port) as url:
                yield url

    @contextlib.contextmanager
    def pod_url(self, pod: client.V1Pod, port: int) -> Iterator[str]:
        """``http://HOST:PORT`` of one pod for the duration of the block."""
        if self.access == "clusterip":
            yield f"http://{pod.status.pod_ip}:{port}"
        else:
            meta = pod.metadata
            with self._port_forward(meta.namespace, f"pod/{meta.name}", port) as url:
                yield url

    @contextlib.contextmanager
    def _port_forward(self, namespace: str, target: str, port: int) -> Iterator[str]:
        forward = subprocess.Popen(
            [self.kubectl_bin, *self._config_args(), "port-forward", "-n", namespace,
             target, f":{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()
            found = _FORWARDING.search(line)
            if not found:
                raise AssertionError(f"kubectl port-forward {target}: {line.decode().strip()}")
            yield f"http://127.0.0.1:{int(found.group(1))}"
        finally:
            forward.terminate()
            forward.wait(timeout=30)
