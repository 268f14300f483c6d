"""``spec.adapters`` and ``status.adapters`` on a real kube-apiserver (v1.20) with the operator
as the chart installs it: what the CRD's schema refuses, what the status keeps."""

import yaml
from kubernetes.client.rest import ApiException

from k8s.cluster_objects import apply_yaml, condition, llmd, namespace
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, load_sample
from kvserve.operator.kube import Kube

pytestmark = NEEDS_CLUSTER


def test_the_api_server_refuses_a_repeated_or_malformed_adapter_name(
    plane: ControlPlane, operator: Operator
) -> None:
    ns = namespace(plane, "adapter-names")
    body = load_sample("cpu-demo.yaml")
    for adapters, refusal in (
        (
            [{"name": "pirate", "source": "/a"}, {"name": "pirate", "source": "/b"}],
            'spec.adapters[1]: Duplicate value: map[string]interface {}{"name":"pirate"}',
        ),
        (
            [{"name": "Pirate", "source": "/a"}],
            'spec.adapters.name: Invalid value: "Pirate": spec.adapters.name in body should '
            "match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
        ),
    ):
        body["spec"]["adapters"] = adapters
        applied = plane.kubectl(
            "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(body), check=False
        )
        assert applied.returncode != 0
        assert refusal in applied.stderr, applied.stderr


def test_a_spec_without_adapters_clears_the_status_adapters(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    ns = namespace(plane, "adapters-cleared")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded"), "the first status")
    shown = [{"name": "pirate", "source": "/a", "state": "Loaded", "message": "served by 2/2"}]

    # As an earlier spec's status left it; the server's answer shows the schema keeps it (the
    # operator may clear it at once, on any status refresh).
    def patched() -> dict | None:
        try:
            return kube.patch_status(llmd(kube, ns, "cpu-demo"), {"adapters": shown})
        except ApiException as e:
            if e.status != 409:  # the operator wrote in between: read again
                raise
            return None

    assert wait_for(patched, "the status patched")["status"]["adapters"] == shown
    plane.kubectl(
        "patch", "llmd", "cpu-demo", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}'
    )
    cleared = wait_for(
        lambda: (b := llmd(kube, ns, "cpu-demo"))["status"].get("observedGeneration") == 2 and b,
        "the next generation's status",
    )
    assert "adapters" not in cleared["status"]
    assert condition(cleared, "AdaptersReady") is None
