"""What the operator's tests share: paths, the CRD and its samples, owners, kubectl and helm."""

import copy
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "llmdeployment.yaml"
SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))
K8S_SCHEMA_VERSION = "1.35.0"


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


def crd_schema() -> dict[str, Any]:
    return load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def crd_validator() -> jsonschema.Draft4Validator:
    """The CRD's openAPIV3Schema read as JSON Schema (the x-kubernetes-* keys are ignored)."""
    return jsonschema.Draft4Validator(crd_schema())


INFERENCE_POOL_CRD_PATH = ROOT / "tests" / "k8s" / "inferencepool-crd.yaml"


def inference_pool_crd(for_1_20: bool = False) -> dict[str, Any]:
    """The published InferencePool CRD (vendored, see its header).

    ``for_1_20``: without the two things a v1.20 API server cannot take: the CEL rules
    (``x-kubernetes-validations``, Kubernetes 1.25+), which kubectl refuses as unknown fields of
    1.20's JSONSchemaProps (and the server would drop), and ``endpointPickerRef.group``'s
    ``default: ""``, which 1.20 reads as null and refuses ("must be of type string").
    """
    crd = yaml.safe_load(INFERENCE_POOL_CRD_PATH.read_text())
    if for_1_20:
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        picker, ports = spec["properties"]["endpointPickerRef"], spec["properties"]["targetPorts"]
        del picker["x-kubernetes-validations"], ports["x-kubernetes-validations"]
        del picker["properties"]["group"]["default"]
    return crd


LEADER_WORKER_SET_CRD_PATH = ROOT / "tests" / "k8s" / "leaderworkerset-crd.yaml"


def _without_empty_defaults(node: Any) -> Any:
    """``node`` without ``default: ""``; a list-map key that loses it becomes required (1.20
    wants one or the other of a key)."""
    if isinstance(node, list):
        return [_without_empty_defaults(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _without_empty_defaults(v) for k, v in node.items() if (k, v) != ("default", "")}
    keys = node.get("x-kubernetes-list-map-keys") or []
    items = node.get("items") or {}
    emptied = [k for k in keys if items.get("properties", {}).get(k, {}).get("default") == ""]
    if emptied:
        required = out["items"].get("required", [])
        out["items"]["required"] = required + [k for k in emptied if k not in required]
    return out


def leader_worker_set_crd(for_1_20: bool = False) -> dict[str, Any]:
    """The published LeaderWorkerSet CRD (vendored, see its header).

    ``for_1_20``: without its ``default: ""`` (the names of ConfigMap and Secret references in
    the pod templates), which a v1.20 API server reads as null and refuses ("must be of type
    string"); ``imagePullSecrets[].name``, a list-map key, is made required instead (1.20
    wants a key defaulted or required)."""
    crd = yaml.safe_load(LEADER_WORKER_SET_CRD_PATH.read_text())
    return _without_empty_defaults(crd) if for_1_20 else crd


def load_sample(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "crds" / "samples" / name).read_text())


def owner(sample: str, namespace: str = "ml", uid: str = "uid-1", generation: int = 1) -> dict:
    """A sample as the API server would hand it to the operator (namespace, uid, generation)."""
    body = copy.deepcopy(load_sample(sample))
    body["metadata"].update(namespace=namespace, uid=uid, generation=generation)
    return body


# What every child of the ``qwen`` sample (rendered by ``owner``) carries.
CHILD_LABELS = {
    "app.kubernetes.io/name": "kvserve",
    "kvserve.io/llmdeployment": "qwen",
    "app.kubernetes.io/component": "server",
    "app.kubernetes.io/managed-by": "kvserve-operator",
}
OWNER_REF = {
    "apiVersion": "kvserve.io/v1alpha1",
    "kind": "LLMDeployment",
    "name": "qwen",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}


HARNESS = ROOT / "scripts" / "kube-control-plane.sh"
CACHE = Path(os.environ.get("KVSERVE_K8S_CACHE", Path.home() / ".cache" / "kvserve-k8s"))
BUILD_IMAGE = ROOT / "scripts" / "build-image.sh"
IMAGE_TAR = CACHE / "images" / "kvserve-dev.tar"
BUILD_TIMEOUT = 2400
"""A cold image build: a Debian base, then the Python dependencies (CPU torch) from PyPI."""


def build_image() -> Path:
    """The serving image as a docker-archive (``IMAGE_TAR``), built by scripts/build-image.sh,
    which skips the build when the hash of its inputs matches the last one's (root only)."""
    subprocess.run([str(BUILD_IMAGE), str(IMAGE_TAR)], check=True, timeout=BUILD_TIMEOUT)
    return IMAGE_TAR


@dataclass(frozen=True)
class KubeTools:
    kubectl: Path
    helm: Path
    env: dict[str, str]
    """Environment for helm: its cache, config and data in a private temporary directory."""

    def helm_run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(self.helm), *args], env=self.env, capture_output=True, text=True)
        if check and out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {out.stderr}")
        return out


NEEDS_CLUSTER = pytest.mark.skipif(
    os.environ.get("KVSERVE_SKIP_K8S") == "1", reason="KVSERVE_SKIP_K8S=1 set explicitly"
)
"""The mark of every module that needs the real control plane."""
