"""Adapters through a gateway: the InferenceModelRewrite the operator renders next to the
InferencePool, where the cluster serves that API, and the condition where it does not."""

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from k8s.loopback_api import answering
from k8s.support import CHILD_LABELS as LABELS
from k8s.support import K8S_SCHEMA_VERSION, OWNER_REF, owner
from kvserve.operator import handlers
from kvserve.operator.children import desired_children
from kvserve.operator.discovery import MODEL_REWRITE_VERSIONS, ClusterApis, discover
from kvserve.operator.inference_pool import stale_pools
from kvserve.operator.model_rewrite import CONDITION, adapter_routes, rewrite_condition
from kvserve.operator.spec import AdapterSpec, parse_spec

REWRITE_CRD = Path(__file__).parent / "inferencemodelrewrite-crd.yaml"
WITH_REWRITES = ClusterApis(inference_pool=True, model_rewrite_version="llm-d.ai/v1alpha2")
ADAPTERS = [
    {"name": "pirate", "source": "/opt/kvserve/adapters/pirate"},
    {"name": "sql", "source": "hf://org/sql-lora"},
]


def gateway_owner(adapters: list[dict[str, str]], pool: dict[str, Any] | None) -> dict[str, Any]:
    body = owner("hf-gpu-autoscaled.yaml")
    body["spec"]["adapters"] = adapters
    if pool is not None:
        body["spec"]["gateway"] = {"inferencePool": pool}
    return body


def rendered(body: dict[str, Any], apis: ClusterApis = WITH_REWRITES) -> dict[str, Any]:
    spec, source = parse_spec(body["spec"])
    return {c["kind"]: c for c in desired_children(body, spec, source, apis, "kvserve:0.1.0", None)}


def test_model_rewrite_exact() -> None:
    children = rendered(gateway_owner(ADAPTERS, {"name": "qwen-pool"}))
    assert list(children)[-2:] == ["InferencePool", "InferenceModelRewrite"]
    assert children["InferenceModelRewrite"] == {
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {
            "name": "qwen-pool",
            "namespace": "ml",
            "labels": LABELS,
            "ownerReferences": [OWNER_REF],
        },
        "spec": {
            "poolRef": {
                "group": "inference.networking.k8s.io",
                "kind": "InferencePool",
                "name": "qwen-pool",
            },
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": "pirate"}}],
                    "targets": [{"modelRewrite": "pirate"}],
                },
                {
                    "matches": [{"model": {"type": "Exact", "value": "sql"}}],
                    "targets": [{"modelRewrite": "sql"}],
                },
            ],
        },
    }


def test_the_older_group_is_rendered_where_only_it_is_served() -> None:
    apis = ClusterApis(
        inference_pool=True, model_rewrite_version="inference.networking.x-k8s.io/v1alpha2"
    )
    rewrite = rendered(gateway_owner(ADAPTERS, {}), apis)["InferenceModelRewrite"]
    assert rewrite["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    assert rewrite["metadata"]["name"] == rewrite["spec"]["poolRef"]["name"] == "qwen"
    assert MODEL_REWRITE_VERSIONS[0] == "llm-d.ai/v1alpha2"  # the newer one wins


@pytest.mark.parametrize(
    ("adapters", "pool", "apis"),
    [
        ([], {}, WITH_REWRITES),
        (ADAPTERS, None, WITH_REWRITES),
        (ADAPTERS, {}, ClusterApis(inference_pool=True)),
        (ADAPTERS, {}, ClusterApis(model_rewrite_version="llm-d.ai/v1alpha2")),
    ],
    ids=["no-adapters", "no-pool", "no-rewrite-api", "no-pool-api"],
)
def test_no_rewrite_without_adapters_a_pool_or_the_apis(
    adapters: list[dict[str, str]], pool: dict[str, Any] | None, apis: ClusterApis
) -> None:
    assert "InferenceModelRewrite" not in rendered(gateway_owner(adapters, pool), apis)


def test_vendored_crd_is_the_published_one_and_valid_for_current_kubernetes() -> None:
    crd = yaml.safe_load(REWRITE_CRD.read_text())
    kubernetes_validate.validate(crd, K8S_SCHEMA_VERSION, strict=True)
    assert (crd["spec"]["group"], crd["spec"]["names"]["plural"]) == (
        "llm-d.ai",
        "inferencemodelrewrites",
    )
    assert [(v["name"], v["served"]) for v in crd["spec"]["versions"]] == [("v1alpha2", True)]


def test_rewrite_passes_the_published_schema() -> None:
    rewrite = rendered(gateway_owner(ADAPTERS, {"name": "qwen-pool"}))["InferenceModelRewrite"]
    crd = yaml.safe_load(REWRITE_CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema).validate(rewrite)
    rewrite["spec"]["rules"][0]["targets"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(rewrite)


def test_stale_rewrites_are_ours_but_the_wanted_one() -> None:
    body = gateway_owner(ADAPTERS, {})
    ours = {"metadata": {"name": "old-pool", "ownerReferences": [OWNER_REF]}}
    theirs = {"metadata": {"name": "canary", "ownerReferences": [{**OWNER_REF, "uid": "x"}]}}
    assert stale_pools([ours, theirs], body, "qwen") == ["old-pool"]


def test_routes_condition_messages_and_its_warning() -> None:
    adapters = [AdapterSpec.model_validate(a) for a in ADAPTERS]
    assert rewrite_condition("qwen-pool", adapters, "llm-d.ai/v1alpha2") == (
        True,
        "RewriteApplied",
        "InferenceModelRewrite qwen-pool routes adapters pirate, sql through InferencePool "
        "qwen-pool by name",
    )
    assert rewrite_condition("qwen-pool", adapters, None) == (
        False,
        "InferenceModelRewriteAPIMissing",
        "the cluster serves no InferenceModelRewrite API (llm-d.ai/v1alpha2 or "
        "inference.networking.x-k8s.io/v1alpha2): adapters pirate, sql pass through "
        "InferencePool qwen-pool undeclared, where a catch-all rewrite would take their "
        "requests; install the endpoint picker's CRDs (the rewrite is made at the next "
        "reconcile after that)",
    )
    assert CONDITION == "AdapterRoutes" and CONDITION in handlers.WARNED_CONDITIONS


def test_the_condition_is_there_only_with_adapters_and_a_served_pool() -> None:
    def routes(adapters: list[dict[str, str]], pool: dict | None, apis: ClusterApis) -> Any:
        body = gateway_owner(adapters, pool)
        return adapter_routes(body, parse_spec(body["spec"])[0], apis)

    assert routes(ADAPTERS, {}, WITH_REWRITES)[:2] == (True, "RewriteApplied")
    missing = routes(ADAPTERS, {}, ClusterApis(inference_pool=True))
    assert missing[:2] == (False, "InferenceModelRewriteAPIMissing")
    assert routes([], {}, WITH_REWRITES) is None
    assert routes(ADAPTERS, None, WITH_REWRITES) is None
    assert routes(ADAPTERS, {}, ClusterApis()) is None  # the InferencePool condition says so


def _group(group_version: str) -> dict[str, Any]:
    name, version = group_version.split("/")
    entry = {"groupVersion": group_version, "version": version}
    return {"name": name, "versions": [entry], "preferredVersion": entry}


def _resources(group_version: str, plural: str, kind: str) -> dict[str, Any]:
    resource = {"name": plural, "singularName": "", "namespaced": True, "kind": kind}
    return {"groupVersion": group_version, "resources": [{**resource, "verbs": ["get"]}]}


@pytest.mark.parametrize(
    ("served", "version"),
    [
        (MODEL_REWRITE_VERSIONS, "llm-d.ai/v1alpha2"),
        (MODEL_REWRITE_VERSIONS[1:], "inference.networking.x-k8s.io/v1alpha2"),
        ((), None),
    ],
)
def test_discovery_finds_the_newest_rewrite_api_served(
    served: tuple[str, ...], version: str | None
) -> None:
    pool = "inference.networking.k8s.io/v1"
    offered = ["autoscaling/v2", "policy/v1", pool, *served]
    answers = {"/apis/": {"kind": "APIGroupList", "groups": [_group(v) for v in offered]}}
    answers[f"/apis/{pool}"] = _resources(pool, "inferencepools", "InferencePool")
    for v in served:
        answers[f"/apis/{v}"] = _resources(v, "inferencemodelrewrites", "InferenceModelRewrite")
    with answering(answers) as api:
        apis = discover(api)
    assert (apis.inference_pool, apis.model_rewrite_version) == (True, version)
