"""A real control plane for the operator's integration tests, and the operator running on it.

``ControlPlane`` starts etcd, kube-apiserver and kube-controller-manager (v1.20, RBAC on)
through scripts/kube-control-plane.sh, which builds and caches them on first use. The operator
runs as a subprocess (``kopf run``) with a kubeconfig holding a token of the chart's
ServiceAccount, with the kopf arguments of the chart's own Deployment, so every call it makes
passes through the chart's RBAC (ClusterRole, or a Role per watched namespace).
"""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from k8s.support import HARNESS, ROOT, KubeTools

sys.path.insert(0, str(ROOT / "e2e"))  # e2e/ holds scripts, not a package
from cluster import wait_for as poll

T = TypeVar("T")


def wait_for(probe: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    return poll(probe, what, timeout, interval=0.2)


class ControlPlane:
    def __init__(self, state: Path, tools: KubeTools) -> None:
        self.state = state
        self.tools = tools
        self.admin_kubeconfig = state / "admin.kubeconfig"

    def start(self) -> None:
        subprocess.run([str(HARNESS), "start", str(self.state)], check=True)
        self.server = (self.state / "env").read_text().split("KUBE_API=")[1].strip()

    def stop(self) -> None:
        subprocess.run([str(HARNESS), "stop", str(self.state)], check=True)

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cfg = str(kubeconfig or self.admin_kubeconfig)
        return subprocess.run(
            [str(self.tools.kubectl), "--kubeconfig", cfg, *args],
            capture_output=True,
            text=True,
            check=check,
            input=stdin,
        )

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.tools.helm_run("--kubeconfig", str(self.admin_kubeconfig), *args)

    def admin_client(self) -> client.ApiClient:
        return config.new_client_from_config(str(self.admin_kubeconfig))

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig whose user is the ServiceAccount, by a token from the TokenRequest API."""
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration=2h").stdout
        path = self.state / f"{name}.kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: local\n  cluster: {{server: '{self.server}', "
            f"certificate-authority: '{self.state / 'ca.crt'}'}}\n"
            f"users:\n- name: sa\n  user: {{token: '{token.strip()}'}}\n"
            "contexts:\n- name: local\n  context: {cluster: local, user: sa}\n"
            "current-context: local\n"
        )
        return path


def kopf_run_args(command: list[str]) -> list[str]:
    """The chart container's ``python -m kopf run ARGS`` as a test runs it: ARGS without the
    liveness endpoint (a fixed port on a shared machine), verbose."""
    assert command[:4] == ["python", "-m", "kopf", "run"], command
    return [a for a in command[4:] if not a.startswith("--liveness=")] + ["--verbose"]


class Operator:
    """``kopf run ARGS`` of kvserve.operator.handlers as a subprocess with its own log file."""

    def __init__(self, kubeconfig: Path, log: Path, args: list[str]) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.env = {"KVSERVE_SERVING_IMAGE": "kvserve:test", "KVSERVE_RESYNC_SECONDS": "3600"}

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kopf", "run", *self.args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def owned_by(obj: Any, uid: str) -> bool:
    refs = obj.metadata.owner_references or []
    return any(r.uid == uid and r.controller for r in refs)
