"""The InferencePool the operator renders for a gateway, its condition, and its clean-up."""

import copy
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from k8s.support import (
    CHILD_LABELS as LABELS,
)
from k8s.support import (
    K8S_SCHEMA_VERSION,
    OWNER_REF,
    crd_validator,
    inference_pool_crd,
    owner,
)
from kvserve.operator.children import desired_children
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.inference_pool import pool_condition, stale_pools
from kvserve.operator.spec import InferencePoolSpec, parse_spec
from kvserve.operator.status import new_warning

WITH_POOL = ClusterApis(inference_pool=True)
PICKER = {"name": "qwen-epp", "port": 9002, "failureMode": "FailOpen"}


def gateway_owner(pool: dict[str, Any]) -> dict[str, Any]:
    body = owner("hf-gpu-autoscaled.yaml")
    body["spec"]["gateway"] = {"inferencePool": pool}
    return body


def rendered(body: dict[str, Any], apis: ClusterApis = WITH_POOL) -> dict[str, dict[str, Any]]:
    spec, source = parse_spec(body["spec"])
    return {c["kind"]: c for c in desired_children(body, spec, source, apis, "kvserve:0.1.0", None)}


def test_inference_pool_exact() -> None:
    children = rendered(gateway_owner({"name": "qwen-pool", "endpointPickerRef": PICKER}))
    assert list(children)[-1] == "InferencePool"
    assert children["InferencePool"] == {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": "qwen-pool",
            "namespace": "ml",
            "labels": LABELS,
            "ownerReferences": [OWNER_REF],
        },
        "spec": {
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "kvserve",
                    "kvserve.io/llmdeployment": "qwen",
                }
            },
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {
                "name": "qwen-epp",
                "port": {"number": 9002},
                "failureMode": "FailOpen",
            },
        },
    }


def test_pool_defaults_to_the_resource_name_and_fail_close() -> None:
    pool = rendered(gateway_owner({"endpointPickerRef": {"name": "epp", "port": 9002}}))
    assert pool["InferencePool"]["metadata"]["name"] == "qwen"
    assert pool["InferencePool"]["spec"]["endpointPickerRef"] == {
        "name": "epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    bare = rendered(gateway_owner({}))["InferencePool"]
    assert bare["spec"] == {
        "selector": {
            "matchLabels": {"app.kubernetes.io/name": "kvserve", "kvserve.io/llmdeployment": "qwen"}
        },
        "targetPorts": [{"number": 8000}],
    }


def test_pool_selects_what_the_deployment_labels_its_pods_on_their_port() -> None:
    children = rendered(gateway_owner({"endpointPickerRef": PICKER}))
    template = children["Deployment"]["spec"]["template"]
    selector = children["InferencePool"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector == children["Service"]["spec"]["selector"]
    (port,) = children["InferencePool"]["spec"]["targetPorts"]
    assert {"name": "http", "containerPort": port["number"], "protocol": "TCP"} in template["spec"][
        "containers"
    ][0]["ports"]


def test_no_pool_without_its_api_or_without_the_spec_asking() -> None:
    assert "InferencePool" not in rendered(
        gateway_owner({"endpointPickerRef": PICKER}), ClusterApis()
    )
    assert "InferencePool" not in rendered(owner("hf-gpu-autoscaled.yaml"))


def test_vendored_crd_is_the_published_v1_and_valid_for_current_kubernetes() -> None:
    crd = inference_pool_crd()
    kubernetes_validate.validate(crd, K8S_SCHEMA_VERSION, strict=True)
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == "v1.6.0"
    assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [
        ("v1", True, True)
    ]
    old = inference_pool_crd(for_1_20=True)
    assert "x-kubernetes-validations" not in json.dumps(old)
    assert "x-kubernetes-validations" in json.dumps(crd)


@pytest.mark.parametrize("pool", [{}, {"name": "p", "endpointPickerRef": PICKER}])
def test_pool_passes_the_published_schema_and_its_cel_rules(pool: dict[str, Any]) -> None:
    rendered_pool = rendered(gateway_owner(pool))["InferencePool"]
    schema = inference_pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema).validate(rendered_pool)
    spec = rendered_pool["spec"]
    # The CEL rules a v1.20 server cannot run: a Service picker names its port; ports unique.
    picker = spec.get("endpointPickerRef")
    assert picker is None or (picker.get("kind", "Service") != "Service" or "port" in picker)
    numbers = [p["number"] for p in spec["targetPorts"]]
    assert len(numbers) == len(set(numbers))
    broken = copy.deepcopy(rendered_pool)
    broken["spec"]["targetPorts"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(broken)


def test_stale_pools_are_ours_but_the_wanted_one() -> None:
    body = owner("hf-gpu-autoscaled.yaml")

    def pool(name: str, uid: str, controller: bool = True) -> dict[str, Any]:
        ref = {**OWNER_REF, "uid": uid, "controller": controller}
        return {"metadata": {"name": name, "ownerReferences": [ref]}}

    listed = [
        pool("qwen", "uid-1"),
        pool("old-name", "uid-1"),
        pool("theirs", "uid-2"),
        pool("not-controller", "uid-1", controller=False),
        {"metadata": {"name": "bare"}},
    ]
    assert stale_pools(listed, body, "qwen") == ["old-name"]
    assert stale_pools(listed, body, None) == ["qwen", "old-name"]


def test_pool_condition_messages() -> None:
    body = owner("hf-gpu-autoscaled.yaml")
    pool = InferencePoolSpec.model_validate({"name": "qwen-pool"})
    assert pool_condition(body, pool, True) == (
        True,
        "PoolApplied",
        "InferencePool qwen-pool selects the pods on port 8000",
    )
    assert pool_condition(body, pool, False) == (
        False,
        "InferencePoolAPIMissing",
        "the spec asks for InferencePool qwen-pool, but the cluster serves no "
        "inference.networking.k8s.io/v1 InferencePool API: install the Gateway API Inference "
        "Extension's CRDs (the pool is made at the next reconcile after that)",
    )


def test_a_false_condition_warns_once_per_reason() -> None:
    def status(state: str, reason: str) -> dict[str, Any]:
        return {"conditions": [{"type": "InferencePool", "status": state, "reason": reason}]}

    missing = status("False", "InferencePoolAPIMissing")
    assert new_warning({}, missing, "InferencePool") == missing["conditions"][0]
    assert new_warning({"status": status("True", "PoolApplied")}, missing, "InferencePool")
    assert new_warning({"status": missing}, missing, "InferencePool") is None
    assert new_warning({"status": missing}, status("True", "PoolApplied"), "InferencePool") is None
    assert new_warning({}, {"conditions": []}, "InferencePool") is None


@pytest.mark.parametrize(
    ("pool", "error"),
    [
        ({"endpointPickerRef": {"name": "epp"}}, "'port' is a required property"),
        ({"endpointPickerRef": {"name": "epp", "port": 9002, "failureMode": "Open"}},
         "'Open' is not one of ['FailClose', 'FailOpen']"),
        ({"name": "Pool_1"}, "'Pool_1' does not match"),
        ({"endpointPickerRef": {"name": "epp", "port": 0}}, "0 is less than the minimum of 1"),
    ],
)  # fmt: skip
def test_crd_schema_rejects_bad_gateways(pool: dict[str, Any], error: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as e:
        crd_validator().validate(gateway_owner(pool))
    assert e.value.message.startswith(error)
