"""Fixtures of the operator's tests (helpers live in k8s.support)."""

import os
import subprocess
import sys
from typing import Any

import pytest

from k8s.support import CACHE, HARNESS, KubeTools, owner


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
