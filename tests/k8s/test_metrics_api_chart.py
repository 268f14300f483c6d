"""The chart's custom metrics API: APIServices with the CA of the serving certificate, RBAC."""

import base64
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from k8s.support import K8S_SCHEMA_VERSION, ROOT, KubeTools

CHART = str(ROOT / "charts" / "kvserve-operator")
NAME = "demo-kvserve-operator-metrics-api"
SELECTOR = {"app.kubernetes.io/name": "kvserve-metrics-api", "app.kubernetes.io/instance": "demo"}
LABELS = {
    **SELECTOR,
    "app.kubernetes.io/component": "metrics-api",
    "app.kubernetes.io/part-of": "kvserve-operator",
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "helm.sh/chart": "kvserve-operator-0.1.0",
}
SUBJECTS = [{"kind": "ServiceAccount", "name": NAME, "namespace": "kvs"}]
RBAC = "rbac.authorization.k8s.io/v1"


def metrics_api_docs(tools: KubeTools, *values: str) -> dict[str, dict[str, Any]]:
    """The metrics API's manifests of ``helm template``, by kind/namespace/name."""
    out = tools.helm_run("template", "demo", CHART, "--namespace", "kvs", *values)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {
        f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}": d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "metrics-api"
    }


def _openssl(*args: str, stdin: bytes | None = None) -> str:
    out = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True)
    return out.stdout.decode()


def test_manifests_are_valid_and_complete(kube_tools: KubeTools) -> None:
    docs = metrics_api_docs(kube_tools)
    assert sorted(docs) == [
        "APIService//v1beta1.custom.metrics.k8s.io",
        "APIService//v1beta2.custom.metrics.k8s.io",
        "ClusterRole//demo-kvserve-operator-apiservices",
        f"ClusterRole//{NAME}",
        "ClusterRoleBinding//demo-kvserve-operator-apiservices",
        f"ClusterRoleBinding//{NAME}",
        f"Deployment/kvs/{NAME}",
        f"RoleBinding/kube-system/{NAME}",
        f"Secret/kvs/{NAME}-tls",
        f"Service/kvs/{NAME}",
        f"ServiceAccount/kvs/{NAME}",
    ]
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    assert metrics_api_docs(kube_tools, "--set", "metricsAPI.enabled=false") == {}


def test_apiservices_trust_the_serving_certificate_by_its_ca(
    kube_tools: KubeTools, tmp_path: Path
) -> None:
    docs = metrics_api_docs(kube_tools)
    secret = docs[f"Secret/kvs/{NAME}-tls"]
    assert secret["type"] == "kubernetes.io/tls" and sorted(secret["data"]) == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]
    for version, priority in (("v1beta1", 100), ("v1beta2", 200)):
        service = docs[f"APIService//{version}.custom.metrics.k8s.io"]
        assert service["metadata"]["labels"] == LABELS
        assert service["spec"] == {
            "group": "custom.metrics.k8s.io",
            "version": version,
            "service": {"name": NAME, "namespace": "kvs", "port": 443},
            "caBundle": secret["data"]["ca.crt"],
            "groupPriorityMinimum": 100,
            "versionPriority": priority,
        }
    for key, value in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    # The kube-apiserver dials https://<service>.<namespace>.svc and checks against caBundle.
    verified = _openssl(
        "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", "sslserver",
        "-verify_hostname", f"{NAME}.kvs.svc", str(tmp_path / "tls.crt"),
    )  # fmt: skip
    assert verified.strip().endswith("OK")
    cert_key = _openssl("x509", "-noout", "-pubkey", "-in", str(tmp_path / "tls.crt"))
    key = _openssl("pkey", "-pubout", "-in", str(tmp_path / "tls.key"))
    assert cert_key == key
    text = _openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt"))
    assert f"DNS:{NAME}, DNS:{NAME}.kvs, DNS:{NAME}.kvs.svc" in text


def test_the_server_runs_on_its_own_identity_with_the_certificate(kube_tools: KubeTools) -> None:
    docs = metrics_api_docs(
        kube_tools,
        "--set-json",
        "metricsAPI.scrapeTimeoutSeconds=1.5",
        "--set",
        "metricsAPI.maxAgeSeconds=10",
    )
    assert docs[f"Service/kvs/{NAME}"]["spec"] == {
        "selector": SELECTOR,
        "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}],
    }
    deployment = docs[f"Deployment/kvs/{NAME}"]["spec"]
    assert deployment["selector"] == {"matchLabels": SELECTOR}
    assert deployment["template"]["metadata"]["labels"] == SELECTOR
    out = kube_tools.helm_run("template", "demo", CHART, "--show-only", "templates/deployment.yaml")
    operator = yaml.safe_load(out.stdout)["spec"]["selector"]["matchLabels"]
    assert not operator.items() <= SELECTOR.items()  # the operator's selector: not these pods
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    (container,) = pod["containers"]
    assert container["command"] == [
        "python",
        "-m",
        "kvserve.operator.metrics_api",
        "--port=6443",
        "--cert-dir=/etc/kvserve/metrics-api-tls",
        "--scrape-timeout=1.5",
        "--max-age=10",
    ]
    assert container["ports"] == [{"name": "https", "containerPort": 6443, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "https",
        "scheme": "HTTPS",
    }
    assert {"name": "tls", "mountPath": "/etc/kvserve/metrics-api-tls", "readOnly": True} in (
        container["volumeMounts"]
    )
    assert {
        "name": "tls",
        "secret": {
            "secretName": f"{NAME}-tls",
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        },
    } in pod["volumes"]


def _binding(kind: str, namespace: str | None, role_kind: str, role: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": NAME, "labels": LABELS}
    if namespace:
        meta = {"name": NAME, "namespace": namespace, "labels": LABELS}
    return {
        "apiVersion": RBAC,
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": SUBJECTS,
    }


REVIEWS = {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"]}
PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}


def test_rbac_is_exactly_its_three_calls(kube_tools: KubeTools) -> None:
    docs = metrics_api_docs(kube_tools)
    rbac = {k: v for k, v in docs.items() if k.endswith(f"/{NAME}") and v["apiVersion"] == RBAC}
    assert rbac == {
        f"ClusterRole//{NAME}": {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": {"name": NAME, "labels": LABELS},
            "rules": [{**REVIEWS, "verbs": ["create"]}, PODS],
        },
        f"ClusterRoleBinding//{NAME}": _binding("ClusterRoleBinding", None, "ClusterRole", NAME),
        f"RoleBinding/kube-system/{NAME}": _binding(
            "RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"
        ),
    }


def test_the_operator_may_read_only_the_groups_apiservices_and_knows_its_service(
    kube_tools: KubeTools,
) -> None:
    out = kube_tools.helm_run("template", "demo", CHART, "--namespace", "kvs")
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d}
    assert docs["ClusterRole/demo-kvserve-operator-apiservices"]["rules"] == [
        {
            "apiGroups": ["apiregistration.k8s.io"],
            "resources": ["apiservices"],
            "resourceNames": ["v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"],
            "verbs": ["get"],
        }
    ]
    binding = docs["ClusterRoleBinding/demo-kvserve-operator-apiservices"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-kvserve-operator", "namespace": "kvs"}
    ]
    (operator,) = docs["Deployment/demo-kvserve-operator"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "KVSERVE_METRICS_API_SERVICE", "value": f"kvs/{NAME}"} in operator["env"]
    out = kube_tools.helm_run(
        "template", "demo", CHART, "--namespace", "kvs", "--set", "metricsAPI.enabled=false"
    )
    assert "KVSERVE_METRICS_API_SERVICE" not in out.stdout and "apiservices" not in out.stdout


def test_watched_namespaces_limit_which_pods_it_may_list(kube_tools: KubeTools) -> None:
    docs = metrics_api_docs(kube_tools, "--set", "watchNamespaces={ml,serving}")
    assert docs[f"ClusterRole//{NAME}"]["rules"] == [{**REVIEWS, "verbs": ["create"]}]
    for namespace in ("ml", "serving"):
        assert docs[f"Role/{namespace}/{NAME}"]["rules"] == [PODS]
        assert docs[f"RoleBinding/{namespace}/{NAME}"] == _binding(
            "RoleBinding", namespace, "Role", NAME
        )


def test_values_schema_holds_the_metrics_api_settings(kube_tools: KubeTools) -> None:
    for bad, message in (
        ("metricsAPI.bogus=1", "additional properties 'bogus' not allowed"),
        ("metricsAPI.maxAgeSeconds=0", "/metricsAPI/maxAgeSeconds"),
        ("metricsAPI.scrapeTimeoutSeconds=0", "/metricsAPI/scrapeTimeoutSeconds"),
    ):
        out = kube_tools.helm_run("template", "demo", CHART, "--set", bad, check=False)
        assert out.returncode == 1 and message in out.stderr, out.stderr
