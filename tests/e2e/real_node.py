"""A real single-node cluster for the e2e tests: the serving image built, a node started with
it imported, and the node stopped afterwards whatever happened.

Each test module runs a node of its own (``settings``: names, addresses and cgroup root apart
from every other node's), so modules never share state and may run side by side.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from k8s.support import ROOT, KubeTools, build_image

sys.path.insert(0, str(ROOT / "e2e"))
from cluster import Cluster

NODE = ROOT / "scripts" / "kube-node.sh"
NODE_TIMEOUT = 300


def skip_reason() -> str | None:
    if os.environ.get("KVSERVE_SKIP_E2E") == "1":
        return "KVSERVE_SKIP_E2E=1 set explicitly"
    if os.environ.get("KVSERVE_SKIP_K8S") == "1":
        return "KVSERVE_SKIP_K8S=1 set explicitly: no Kubernetes binaries for the node"
    if os.geteuid() != 0:
        return "the real node needs root (network namespace, containerd, kubelet)"
    return None


@contextmanager
def real_node(tools: KubeTools, state: Path, settings: dict[str, str]) -> Iterator[Cluster]:
    """Build the image (cached), start a node in ``state`` with it, yield its ``Cluster``."""
    image = build_image()
    try:
        start = [str(NODE), "start", str(state), str(image)]
        env = {**os.environ, **settings}
        subprocess.run(start, check=True, timeout=NODE_TIMEOUT, env=env)
        lines = (state / "env").read_text().splitlines()
        kubeconfig = Path(dict(line.split("=", 1) for line in lines if "=" in line)["KUBECONFIG"])
        yield Cluster(kubeconfig, str(tools.kubectl), str(tools.helm), tools.env)
    finally:
        subprocess.run([str(NODE), "stop", str(state)], check=True, timeout=NODE_TIMEOUT)
        # The node's runtime state (containerd's images and snapshots, about 3 GB); logs stay.
        shutil.rmtree(state / "state", ignore_errors=False)
