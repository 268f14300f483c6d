"""An LLMDeployment's LoRA adapters (``spec.adapters``) in its pod template.

What a running pod can load without a restart decides what the template holds. An adapter
whose files a pod already has is loaded at run time by the operator (``adapter_sync``) and
stays out of the template, so adding or removing one rolls no pod:
- an absolute path inside the image: passed as is;
- ``pvc://claim/path``: the claim is mounted read-only at ``/adapters/pvc/<claim>``; the set of
  claims is in the template (a volume cannot be added to a running pod), so an adapter on a
  claim no pod mounts yet rolls the pods once, and one more on a mounted claim does not.
- ``hf://org/name``: a pod cannot download at run time, so each one is an init container
  (``fetch-adapter-<name>``, the model's download program) writing into an emptyDir at
  ``/adapters/hf/<name>``, and a ``--lora-modules`` entry at start: adding or removing one
  rolls the pods, which then start with it.

With any adapter the server runs with ``--enable-lora`` and
``KVSERVE_ALLOW_RUNTIME_LORA_UPDATING=true`` (the load and unload endpoints), and the pod has
the readiness gate ``ADAPTERS_GATE``: it is Ready (in the Service, in an InferencePool) only
once the operator has brought it to the list (``adapter_sync``) and set that condition on it,
so a new pod starts serving with the current list. The condition is set once, after the first
sync that reached the server, whatever it loaded: an adapter that fails is reported in the
status, and does not keep new pods from serving the others.
"""

from dataclasses import dataclass
from typing import Any

from kvserve.operator.spec import LLMDeploymentSpec, ModelSource, parse_model_source

ADAPTERS_DIR = "/adapters"
HF_ADAPTERS_DIR = f"{ADAPTERS_DIR}/hf"
PVC_ADAPTERS_DIR = f"{ADAPTERS_DIR}/pvc"
HF_VOLUME = "adapters-hf"
CLAIM_VOLUME_PREFIX = "adapters-claim-"
FETCH_ADAPTER_PREFIX = "fetch-adapter-"
RUNTIME_UPDATES_ENV = "KVSERVE_ALLOW_RUNTIME_LORA_UPDATING"
ADAPTERS_GATE = "kvserve.io/adapters-synced"


@dataclass(frozen=True)
class Adapter:
    name: str
    source: ModelSource

    @property
    def path(self) -> str:
        """Where the pod's server finds the adapter's files."""
        if self.source.scheme == "image":
            return self.source.location
        if self.source.scheme == "hf":
            return f"{HF_ADAPTERS_DIR}/{self.name}"
        claim_dir = f"{PVC_ADAPTERS_DIR}/{self.source.location}"
        return f"{claim_dir}/{self.source.path}" if self.source.path else claim_dir


def adapters(spec: LLMDeploymentSpec) -> list[Adapter]:
    """``spec.adapters`` with their sources parsed (the spec passed ``adapters_problem``)."""
    return [Adapter(a.name, parse_model_source(a.source)) for a in spec.adapters]


def _claims(spec: LLMDeploymentSpec) -> list[str]:
    return sorted({a.source.location for a in adapters(spec) if a.source.scheme == "pvc"})


def adapter_args(spec: LLMDeploymentSpec) -> list[str]:
    """``--enable-lora`` with any adapter, and the ``hf://`` ones as ``--lora-modules``."""
    if not spec.adapters:
        return []
    fetched = [f"{a.name}={a.path}" for a in adapters(spec) if a.source.scheme == "hf"]
    return ["--enable-lora", *(["--lora-modules", *fetched] if fetched else [])]


def adapter_env(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    return [{"name": RUNTIME_UPDATES_ENV, "value": "true"}] if spec.adapters else []


def adapter_readiness_gates(spec: LLMDeploymentSpec) -> list[dict[str, str]]:
    return [{"conditionType": ADAPTERS_GATE}] if spec.adapters else []


def adapter_volumes(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The pod's volumes for the adapters: an emptyDir for the downloads, one per claim."""
    volumes: list[dict[str, Any]] = []
    if any(a.source.scheme == "hf" for a in adapters(spec)):
        volumes.append({"name": HF_VOLUME, "emptyDir": {}})
    for i, claim in enumerate(_claims(spec)):
        claim_ref = {"claimName": claim, "readOnly": True}
        volumes.append({"name": f"{CLAIM_VOLUME_PREFIX}{i}", "persistentVolumeClaim": claim_ref})
    return volumes


def adapter_mounts(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The server's read-only mounts of ``adapter_volumes``."""
    mounts: list[dict[str, Any]] = []
    if any(a.source.scheme == "hf" for a in adapters(spec)):
        mounts.append({"name": HF_VOLUME, "mountPath": HF_ADAPTERS_DIR, "readOnly": True})
    for i, claim in enumerate(_claims(spec)):
        mount = {"name": f"{CLAIM_VOLUME_PREFIX}{i}", "mountPath": f"{PVC_ADAPTERS_DIR}/{claim}"}
        mounts.append({**mount, "readOnly": True})
    return mounts


def hf_adapters(spec: LLMDeploymentSpec) -> list[Adapter]:
    """The adapters an init container downloads, each into its ``path``."""
    return [a for a in adapters(spec) if a.source.scheme == "hf"]
