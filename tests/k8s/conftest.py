"""Fixtures of the operator's tests (helpers live in k8s.support)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from k8s.cluster_objects import NO_METRICS_API, denials, install_operator
from k8s.kube_cluster import ControlPlane, Operator
from k8s.support import CACHE, HARNESS, KubeTools, owner
from kvserve.operator.kube import Kube


@pytest.fixture
def hf_owner() -> dict[str, Any]:
    return owner("hf-gpu-autoscaled.yaml")


@pytest.fixture(scope="session")
def kube_tools(tmp_path_factory: pytest.TempPathFactory) -> KubeTools:
    """kubectl 1.35 and helm 4, fetched once by the harness script into the cache."""
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run([str(HARNESS), "tools"], env=env, check=True)
    home = tmp_path_factory.mktemp("helm")
    helm_env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return KubeTools(CACHE / "tools" / "kubectl", CACHE / "tools" / "helm", helm_env)


@pytest.fixture(scope="module")
def plane(
    kube_tools: KubeTools, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A fresh control plane for each module of cluster tests."""
    cp = ControlPlane(tmp_path_factory.mktemp("control-plane"), kube_tools)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def chart_values() -> list[str]:
    """``helm install`` arguments for the operator chart; a module overrides this fixture."""
    return NO_METRICS_API


@pytest.fixture(scope="module")
def operator(plane: ControlPlane, chart_values: list[str]) -> Iterator[Operator]:
    """The operator as the chart installs it; its log must show no traceback and no denial."""
    op = install_operator(plane, chart_values)
    op.start()
    try:
        yield op
    finally:
        op.stop()
        log = op.text()
        assert "Traceback" not in log, log[-5000:]
        assert denials(log) == [], log[-5000:]


@pytest.fixture(scope="module")
def kube(plane: ControlPlane) -> Kube:
    return Kube(plane.admin_client())
