"""The LLMDeployment spec as the operator reads it, and the checks the CRD schema cannot make.

The CRD's openAPIV3Schema (crds/llmdeployment.yaml) rejects wrong types and ranges at the API
server; its defaults equal the ones below (a test holds them together). What a v1.20 schema
cannot express (cross-field rules, the model source's scheme, strings Kubernetes limits where
they go: ``names``) is checked here: ``parse_spec`` raises ``InvalidSpec``, which the operator
reports as a ``Degraded`` condition and an Event instead of retrying.
"""

import json
import re
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from kvserve.engine.settings import Declared
from kvserve.engine.spec_decode.config import SpeculativeConfig
from kvserve.operator.names import label_value_problem, service_name_problem
from kvserve.operator.quantity import check_quantity
from kvserve.operator.resource import HTTP_PORT
from kvserve.server.server_settings import CRD_ENGINE_SETTINGS


class InvalidSpec(ValueError):
    """The spec can never be reconciled as written; only an edit of the spec fixes it."""

    reason = "InvalidSpec"
    """The ``Degraded`` condition's and the Event's reason."""


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class SecretKey(_Spec):
    name: str
    key: str = "token"


class ModelSpec(_Spec):
    source: str
    revision: str | None = None
    served_name: str | None = Field(None, alias="servedName")
    hub_token_secret: SecretKey | None = Field(None, alias="hubTokenSecret")


class AutoscalingSpec(_Spec):
    min_replicas: int = Field(1, alias="minReplicas")
    max_replicas: int = Field(alias="maxReplicas")
    target_waiting_requests: int | None = Field(None, alias="targetWaitingRequests")
    target_kv_cache_usage: float | None = Field(None, alias="targetKVCacheUsage")
    scale_down_stabilization_seconds: int = Field(300, alias="scaleDownStabilizationSeconds")
    controller: Literal["HPA", "External"] = "HPA"
    """``HPA``: the operator owns a HorizontalPodAutoscaler. ``External``: another autoscaler
    (e.g. a KEDA ScaledObject) scales the Deployment; the operator only keeps it in bounds."""


class ResourcesSpec(_Spec):
    gpus: int = 0
    gpu_resource: str = Field("nvidia.com/gpu", alias="gpuResource")
    gpu_product: str | None = Field(None, alias="gpuProduct")
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = Field(None, alias="shmSize")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    ranks_per_pod: int | None = Field(None, alias="ranksPerPod", ge=1)
    """Ranks each pod runs (``pods_per_replica``): with GPUs, one per GPU (``gpus``, which it
    must equal when given); without, all of the replica's unless set."""


class KVEventsSpec(_Spec):
    """KV-cache events on a ZMQ PUB socket (vLLM's ``--kv-events-config``), for prefix-aware
    endpoint pickers."""

    enabled: bool = False
    port: int = 5557


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


if TYPE_CHECKING:

    class SpeculativeSpec(_Spec):
        """What mypy sees of the model built below."""

        def __init__(self, **data: Any) -> None: ...

else:
    SpeculativeSpec = create_model(
        "SpeculativeSpec",
        __base__=_Spec,
        __doc__="Speculative decoding (vLLM's ``--speculative-config``): ``SpeculativeConfig``'s "
        "keys in camelCase, checked by the server's own rules (``server_args``).",
        **{
            f.name: (f.type, Field(f.default, alias=_camel(f.name)))
            if f.default is not MISSING
            else (f.type, Field(alias=_camel(f.name)))
            for f in fields(SpeculativeConfig)
        },
    )


def speculative_config_json(spec: "SpeculativeSpec") -> str:
    """The ``--speculative-config`` JSON: the keys the spec sets, as vLLM spells them."""
    return json.dumps(spec.model_dump(exclude_none=True))


def _engine_field(d: Declared) -> tuple[Any, Any]:
    """A declared setting as an ``EngineSpec`` field: its CRD name, its choices as a Literal;
    None (the server's default) unless the CRD gives the default."""
    kind = Literal[d.setting.choices] if d.setting.choices else d.kind
    if d.setting.crd is not None and d.setting.crd.defaulted:
        return kind, Field(d.default, alias=d.crd_name)
    return kind | None, Field(None, alias=d.crd_name)


if TYPE_CHECKING:

    class EngineSpec(_Spec):
        """What mypy sees of the model built below, whose declared fields it cannot see: the
        fields the operator reads by name. The others it reads with ``getattr``, one per
        ``CRD_ENGINE_SETTINGS`` entry (``deployment.engine_flags``)."""

        tensor_parallel_size: int
        pipeline_parallel_size: int
        kv_events: KVEventsSpec
        speculative_config: SpeculativeSpec | None

        def __init__(self, **data: Any) -> None:
            """Every field has a default (the CRD's, or None)."""

else:
    EngineSpec = create_model(
        "EngineSpec",
        __base__=_Spec,
        __doc__="The CRD's ``engine`` block: the declared settings (``CRD_ENGINE_SETTINGS``), "
        "``kvEvents`` and ``pipelineParallelSize`` (vLLM's ``--pipeline-parallel-size``).",
        **{d.name: _engine_field(d) for d in CRD_ENGINE_SETTINGS},
        kv_events=(KVEventsSpec, Field(default_factory=KVEventsSpec, alias="kvEvents")),
        pipeline_parallel_size=(int, Field(1, alias="pipelineParallelSize", ge=1)),
        speculative_config=(SpeculativeSpec | None, Field(None, alias="speculativeConfig")),
    )


class EndpointPickerRef(_Spec):
    """The endpoint picker's Service (e.g. the llm-d router) and its port."""

    name: str
    port: int
    failure_mode: Literal["FailClose", "FailOpen"] = Field("FailClose", alias="failureMode")


class InferencePoolSpec(_Spec):
    name: str | None = None
    """The pool's name; defaults to the LLMDeployment's."""
    endpoint_picker_ref: EndpointPickerRef | None = Field(None, alias="endpointPickerRef")


class GatewaySpec(_Spec):
    inference_pool: InferencePoolSpec | None = Field(None, alias="inferencePool")


class DrainSpec(_Spec):
    timeout_seconds: int = Field(120, alias="timeoutSeconds")


class AdapterSpec(_Spec):
    """A LoRA adapter the pods serve next to the model, under ``name``."""

    name: str
    source: str


class LLMDeploymentSpec(_Spec):
    model: ModelSpec
    replicas: int = 1
    autoscaling: AutoscalingSpec | None = None
    image: str | None = None
    image_pull_policy: str | None = Field(None, alias="imagePullPolicy")
    api_key_secret: SecretKey | None = Field(None, alias="apiKeySecret")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    extra_args: list[str] = Field(default_factory=list, alias="extraArgs")
    env: list[dict[str, Any]] = Field(default_factory=list)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    adapters: list[AdapterSpec] = Field(default_factory=list)


@dataclass(frozen=True)
class ModelSource:
    """Where a pod finds its checkpoint. ``scheme`` is ``hf``, ``pvc`` or ``image``."""

    scheme: Literal["hf", "pvc", "image"]
    location: str
    """``org/name`` for hf, the claim name for pvc, the absolute path for image."""
    path: str = ""
    """For pvc: the checkpoint's directory inside the claim ('' = the claim's root)."""


RESOURCE_BOUNDS = {
    "cpu": ("1m", "1000000"),
    "memory": ("512Mi", "1Pi"),
    "shmSize": ("1Mi", "1Pi"),
}
"""Quantities a serving pod can be given: beyond them, no node fits it (the API server clamps
anything past 2^63-1 instead of refusing it), or, below 512Mi of memory, the server is killed
while it imports torch (about 300 MiB on its own)."""

_HF_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_model_source(source: str, field: str = "model.source") -> ModelSource:
    """``source`` (the model's, or an adapter's: ``field`` names it in the error)."""
    if source.startswith("/"):
        return ModelSource("image", source)
    scheme, sep, rest = source.partition("://")
    if not sep:
        raise InvalidSpec(
            f"{field} {source!r} is neither hf://org/name, pvc://claim/path "
            "nor an absolute path inside the image"
        )
    if scheme == "hf":
        if not _HF_REPO.match(rest) or ".." in rest:
            raise InvalidSpec(f"{field} {source!r}: expected hf://org/name")
        return ModelSource("hf", rest)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS_NAME.match(claim) or ".." in path.split("/"):
            raise InvalidSpec(f"{field} {source!r}: expected pvc://claim/path")
        return ModelSource("pvc", claim, path.strip("/"))
    raise InvalidSpec(
        f"{field} {source!r}: unknown scheme {scheme!r} (use hf://, pvc:// "
        "or an absolute path inside the image)"
    )


_ADAPTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ADAPTER_NAME_MAX = 49
"""``fetch-adapter-`` and the name make an init container's name, a DNS label (63)."""


def adapters_problem(spec: LLMDeploymentSpec, name: str) -> str | None:
    """Why ``spec.adapters`` cannot be served by the LLMDeployment ``name``, or None: each
    adapter's name is a DNS label short enough to name its init container
    (``ADAPTER_NAME_MAX``), unique, and not the model's own served name (clients pick an
    adapter by its name as the request's model); each source parses as the model's does."""
    served = spec.model.served_name or name
    seen: set[str] = set()
    for i, adapter in enumerate(spec.adapters):
        where = f"adapters[{i}]"
        if not _ADAPTER_NAME.match(adapter.name) or len(adapter.name) > ADAPTER_NAME_MAX:
            return (
                f"{where}.name {adapter.name!r} is not a DNS label of {ADAPTER_NAME_MAX} "
                "characters at most (a-z, 0-9, '-')"
            )
        if adapter.name in seen:
            return f"{where}.name {adapter.name!r} is given twice"
        if adapter.name == served:
            return f"{where}.name {adapter.name!r} is the model's served name"
        seen.add(adapter.name)
        try:
            parse_model_source(adapter.source, f"{where}.source")
        except InvalidSpec as e:
            return str(e)
    return None


def parse_spec(raw: dict[str, Any]) -> tuple[LLMDeploymentSpec, ModelSource]:
    """Validate a spec as stored by the API server; raise ``InvalidSpec`` with one message."""
    try:
        spec = LLMDeploymentSpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidSpec(f"spec.{where}: {first['msg']}") from None
    source = parse_model_source(spec.model.source)
    res = spec.resources
    for field, text in (("cpu", res.cpu), ("memory", res.memory), ("shmSize", res.shm_size)):
        if text is not None:
            try:
                check_quantity(f"resources.{field}", text, *RESOURCE_BOUNDS[field])
            except ValueError as e:
                raise InvalidSpec(str(e)) from None
    scaling = spec.autoscaling
    if scaling is not None:
        if scaling.min_replicas > scaling.max_replicas:
            raise InvalidSpec(
                f"autoscaling.minReplicas ({scaling.min_replicas}) is greater than "
                f"autoscaling.maxReplicas ({scaling.max_replicas})"
            )
        no_target = (
            scaling.target_waiting_requests is None and scaling.target_kv_cache_usage is None
        )
        if scaling.controller == "HPA" and no_target:
            raise InvalidSpec("autoscaling needs targetWaitingRequests and/or targetKVCacheUsage")
    parallelism = parallelism_problem(spec)
    if parallelism is not None:
        raise InvalidSpec(parallelism)
    events = spec.engine.kv_events
    if events.enabled and events.port == HTTP_PORT:
        raise InvalidSpec(f"engine.kvEvents.port {HTTP_PORT} is the server's HTTP port")
    problem = names_problem(spec)
    if problem is not None:
        raise InvalidSpec(problem)
    return spec, source


def world_size(spec: LLMDeploymentSpec) -> int:
    """The ranks of one model replica: tensor × pipeline parallel size."""
    return spec.engine.tensor_parallel_size * spec.engine.pipeline_parallel_size


def ranks_per_pod(spec: LLMDeploymentSpec) -> int:
    """``resources.ranksPerPod``, else one rank per GPU, else (on a CPU) every rank."""
    res = spec.resources
    return res.ranks_per_pod or res.gpus or world_size(spec)


def pods_per_replica(spec: LLMDeploymentSpec) -> int:
    """Pods that serve one model replica together: above 1, a LeaderWorkerSet's group
    (``leader_worker_set``). ``parallelism_problem`` holds it to a whole number."""
    return world_size(spec) // ranks_per_pod(spec)


def parallelism_problem(spec: LLMDeploymentSpec) -> str | None:
    """Why the ranks (``world_size``) cannot be spread evenly over pods of ``ranks_per_pod``,
    or None: a pod runs one rank per GPU, and every pod of a group the same number."""
    tp, pp = spec.engine.tensor_parallel_size, spec.engine.pipeline_parallel_size
    res = spec.resources
    if res.gpus and res.ranks_per_pod not in (None, res.gpus):
        return (
            f"resources.ranksPerPod {res.ranks_per_pod} and resources.gpus {res.gpus} "
            "disagree: a pod runs one rank per GPU"
        )
    ranks, world = ranks_per_pod(spec), world_size(spec)
    if world % ranks:
        per_pod = f"resources.gpus {res.gpus}" if res.gpus else f"resources.ranksPerPod {ranks}"
        return (
            f"engine.tensorParallelSize {tp} × engine.pipelineParallelSize {pp} = {world} "
            f"ranks cannot be spread evenly over pods of {per_pod} ranks each: {per_pod} "
            f"must divide {world}"
        )
    return None


def names_problem(spec: LLMDeploymentSpec) -> str | None:
    """Why a string of ``spec`` cannot be put where it goes (``names``), or None: the values of
    the pods' ``nodeSelector`` are label values, the endpoint picker is a Service. (The pool's
    own name is a DNS-1123 subdomain, which the CRD's schema holds.)"""
    res = spec.resources
    values = [] if res.gpu_product is None else [("resources.gpuProduct", res.gpu_product)]
    values += [(f"resources.nodeSelector[{k!r}]", v) for k, v in res.node_selector.items()]
    for field, value in values:
        problem = label_value_problem(field, value)
        if problem is not None:
            return problem
    pool = spec.gateway.inference_pool
    if pool is not None and pool.endpoint_picker_ref is not None:
        field = "gateway.inferencePool.endpointPickerRef.name"
        return service_name_problem(field, pool.endpoint_picker_ref.name)
    return None
