"""The Deployment that runs ``kvserve serve`` for one LLMDeployment.

Design rules, each visible in the rendered pod:
- no stream is cut on scale-down or rollout: the preStop hook sleeps ``PRESTOP_SECONDS`` while
  the endpoints controller takes the terminating pod out of the Service, then SIGTERM makes the
  server drain for up to ``drain.timeoutSeconds``; ``terminationGracePeriodSeconds`` covers
  both plus a margin, so the kubelet never SIGKILLs a draining server. Rollouts surge one pod
  and never take a ready one away first (maxUnavailable 0).
- the model is a path inside the container: baked into the image, a PVC mounted read-only at
  /models, or an ``hf://`` repository that an init container (same image) downloads into an
  emptyDir at /models/model before the server starts.
- pods run as a non-root user with a read-only root filesystem; /tmp (HOME, caches) and
  /dev/shm (memory-backed, 1Gi for each of the pod's ranks) are emptyDirs.
- the server needs no Kubernetes API access: no service-account token is mounted.
- with a CPU limit, the server runs as many threads as it gives (``OMP_NUM_THREADS``).
- a failed download leaves one line naming its cause as the init container's termination
  message (``fetch_model``), a server that exits on an error its log's tail; the
  ``ModelLoaded`` condition quotes either. Both containers fall back to their log's tail when
  they die without writing one (killed, or failing before the program runs).
- ``spec.env`` reaches the download too (``HF_ENDPOINT``, proxies); an entry of it replaces
  ours of the same name in either container.
"""

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kvserve.operator.adapters import (
    FETCH_ADAPTER_PREFIX,
    HF_ADAPTERS_DIR,
    HF_VOLUME,
    adapter_args,
    adapter_env,
    adapter_mounts,
    adapter_readiness_gates,
    adapter_volumes,
    hf_adapters,
)
from kvserve.operator.quantity import parse_quantity
from kvserve.operator.resource import HTTP_PORT, child_metadata, labels, selector_labels
from kvserve.operator.spec import (
    LLMDeploymentSpec,
    ModelSource,
    ranks_per_pod,
    speculative_config_json,
)
from kvserve.server.server_settings import CRD_ENGINE_SETTINGS

PRESTOP_SECONDS = 5
GRACE_MARGIN_SECONDS = 15
MODELS_DIR = "/models"
HF_MODEL_DIR = f"{MODELS_DIR}/model"
RUN_AS_USER = 1000
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
SERVER_CONTAINER = "server"
FETCH_CONTAINER = "fetch-model"
POD_NAME_ENV = "POD_NAME"
KV_EVENTS_PORT_NAME = "kv-events"

FETCH_SCRIPT = (Path(__file__).parent / "fetch_model.py").read_text()
"""The init container's program (``fetch_model``): argv = repository id, revision ('' = the
default), directory."""


def model_path(source: ModelSource) -> str:
    if source.scheme == "image":
        return source.location
    if source.scheme == "hf":
        return HF_MODEL_DIR
    return f"{MODELS_DIR}/{source.path}" if source.path else MODELS_DIR


def serve_args(name: str, spec: LLMDeploymentSpec, source: ModelSource) -> list[str]:
    """``kvserve serve`` flags: the fixed ones, then each engine setting the spec gives."""
    engine = spec.engine
    args = [
        "serve",
        "--model", model_path(source),
        "--served-model-name", spec.model.served_name or name,
        "--host", "0.0.0.0",
        "--port", str(HTTP_PORT),
        "--device", "cuda" if spec.resources.gpus else "cpu",
        *engine_flags(engine, defaulted=True),
        "--shutdown-timeout", str(spec.drain.timeout_seconds),
        *engine_flags(engine, defaulted=False),
    ]  # fmt: skip
    if engine.kv_events.enabled:
        args += ["--kv-events-config", kv_events_config(spec, name)]
    if engine.speculative_config is not None:
        args += ["--speculative-config", speculative_config_json(engine.speculative_config)]
    return args + adapter_args(spec) + list(spec.extra_args)


def pipeline_args(spec: LLMDeploymentSpec) -> list[str]:
    """vLLM's ``--pipeline-parallel-size``, for a spec that splits the layers in stages."""
    pp = spec.engine.pipeline_parallel_size
    return [] if pp == 1 else ["--pipeline-parallel-size", str(pp)]


def engine_flags(engine: BaseModel, defaulted: bool) -> list[str]:
    """The flags of ``spec.engine``'s declared settings (``CRD_ENGINE_SETTINGS``, in their
    order) whose default the CRD gives (always set), or else those the spec sets."""
    flags: list[str] = []
    for d in CRD_ENGINE_SETTINGS:
        crd, value = d.setting.crd, getattr(engine, d.name)
        if crd is None or crd.defaulted != defaulted or value is None:
            continue
        if d.kind is bool:
            flags.append(d.flag if value else "--no-" + d.flag.removeprefix("--"))
        else:
            flags += [*crd.with_flags, d.flag, str(value)]
    return flags


def kv_events_config(spec: LLMDeploymentSpec, name: str) -> str:
    """vLLM's ``--kv-events-config`` JSON. The topic names the pod (``$(POD_NAME)``, which the
    kubelet expands from the downward-API variable) and the served model, as the llm-d router
    subscribes to it (``kv@<pod>@<model>``)."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{spec.engine.kv_events.port}",
        "topic": f"kv@$({POD_NAME_ENV})@{spec.model.served_name or name}",
    }
    return json.dumps(config)


def _secret_env(name: str, secret: Any) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}


def cpu_threads(cpu: str | None) -> int | None:
    """Threads for torch and the CPU attention kernel: the CPU limit, rounded up.

    Left alone, torch sizes its pool by the node's cores; a pod's CPU quota then throttles the
    surplus threads (measured on a 2-core node with a 500m limit: decode about 2x slower)."""
    return None if cpu is None else max(1, math.ceil(parse_quantity(cpu)))


def server_env(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The server's environment; an entry of ``spec.env`` replaces ours of the same name."""
    ours: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    if spec.engine.kv_events.enabled:
        ours.append(
            {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        )
    threads = cpu_threads(spec.resources.cpu)
    if threads is not None:
        ours.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    if spec.api_key_secret is not None:
        ours.append(_secret_env("KVSERVE_API_KEY", spec.api_key_secret))
    return _merged_env(ours + adapter_env(spec), spec)


def _merged_env(ours: list[dict[str, Any]], spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """``ours``, then ``spec.env``; an entry of ``spec.env`` replaces ours of the same name."""
    merged = {e["name"]: e for e in ours + list(spec.env)}
    return list(merged.values())


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _resources(spec: LLMDeploymentSpec) -> dict[str, Any]:
    res = spec.resources
    amounts: dict[str, str] = {}
    if res.cpu is not None:
        amounts["cpu"] = res.cpu
    if res.memory is not None:
        amounts["memory"] = res.memory
    if res.gpus:
        amounts[res.gpu_resource] = str(res.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _model_volume(source: ModelSource) -> dict[str, Any] | None:
    if source.scheme == "hf":
        return {"name": "model", "emptyDir": {}}
    if source.scheme == "pvc":
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.location, "readOnly": True},
        }
    return None


def _fetch_container(
    spec: LLMDeploymentSpec, image: str, name: str, args: list[str], mount: dict[str, Any]
) -> dict:
    """An init container that runs ``FETCH_SCRIPT`` with ``args`` (repository, revision,
    directory) and writes into ``mount``."""
    ours: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
    ]
    if spec.model.hub_token_secret is not None:
        ours.append(_secret_env("HF_TOKEN", spec.model.hub_token_secret))
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": ["python", "-c", FETCH_SCRIPT],
        "args": args,
        "env": _merged_env(ours, spec),
        "securityContext": _security_context(),
        "volumeMounts": [mount, {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


def _ports(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]
    if spec.engine.kv_events.enabled:
        port = spec.engine.kv_events.port
        ports.append({"name": KV_EVENTS_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    return ports


def _http_probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def render_deployment(
    owner: dict[str, Any],
    spec: LLMDeploymentSpec,
    source: ModelSource,
    image: str,
    replicas: int,
) -> dict[str, Any]:
    name = owner["metadata"]["name"]
    res = spec.resources
    shm = f"{ranks_per_pod(spec)}Gi"
    mounts: list[dict[str, Any]] = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size or shm}},
        {"name": "tmp", "emptyDir": {}},
    ]
    model_volume = _model_volume(source)
    if model_volume is not None:
        volumes.append(model_volume)
        mounts.append({"name": "model", "mountPath": MODELS_DIR, "readOnly": True})
    volumes += adapter_volumes(spec)
    mounts += adapter_mounts(spec)
    server: dict[str, Any] = {
        "name": SERVER_CONTAINER,
        "image": image,
        "command": ["kvserve"],
        "args": serve_args(name, spec, source) + pipeline_args(spec),
        "ports": _ports(spec),
        "env": server_env(spec),
        "resources": _resources(spec),
        "securityContext": _security_context(),
        "volumeMounts": mounts,
        "startupProbe": _http_probe("/health", period=5, failures=360, timeout=3),
        "readinessProbe": _http_probe("/ready", period=5, failures=2, timeout=3),
        "livenessProbe": _http_probe("/health", period=10, failures=3, timeout=5),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.image_pull_policy:
        server["imagePullPolicy"] = spec.image_pull_policy
    node_selector = dict(res.node_selector)
    tolerations = list(res.tolerations)
    if res.gpus:
        if res.gpu_product:
            node_selector[GPU_PRODUCT_LABEL] = res.gpu_product
        if not tolerations:
            tolerations = [{"key": res.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": (
            PRESTOP_SECONDS + spec.drain.timeout_seconds + GRACE_MARGIN_SECONDS
        ),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [server],
        "volumes": volumes,
    }
    init = [
        _fetch_container(
            spec,
            image,
            f"{FETCH_ADAPTER_PREFIX}{a.name}",
            [a.source.location, "", a.path],
            {"name": HF_VOLUME, "mountPath": HF_ADAPTERS_DIR},
        )
        for a in hf_adapters(spec)
    ]
    if source.scheme == "hf":
        model_args = [source.location, spec.model.revision or "", HF_MODEL_DIR]
        model_mount = {"name": "model", "mountPath": MODELS_DIR}
        init.insert(0, _fetch_container(spec, image, FETCH_CONTAINER, model_args, model_mount))
    if init:
        pod["initContainers"] = init
    gates = adapter_readiness_gates(spec)
    if gates:
        pod["readinessGates"] = gates
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(owner),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "progressDeadlineSeconds": 1800,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels(name),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(HTTP_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    }
