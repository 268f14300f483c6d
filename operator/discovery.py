"""What the cluster serves, read from API discovery before each reconciliation.

Kubernetes 1.20 serves ``autoscaling/v2beta2`` and ``policy/v1beta1`` only; 1.23+ serve
``autoscaling/v2`` and 1.25+ have removed the betas. The operator renders the newest version the
server offers. The PodMonitor is rendered only where the Prometheus operator's
``monitoring.coreos.com`` API exists, the InferencePool only where the Gateway API Inference
Extension's ``inference.networking.k8s.io/v1`` does, the LeaderWorkerSet only where
``leaderworkerset.x-k8s.io/v1`` does, and the adapters' InferenceModelRewrite in the newest of
``MODEL_REWRITE_VERSIONS`` served (none: not rendered).
"""

from dataclasses import dataclass

from kubernetes import client

HPA_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")
PDB_VERSIONS = ("policy/v1", "policy/v1beta1")
POD_MONITOR_VERSION = "monitoring.coreos.com/v1"
INFERENCE_POOL_VERSION = "inference.networking.k8s.io/v1"
LEADER_WORKER_SET_VERSION = "leaderworkerset.x-k8s.io/v1"
MODEL_REWRITE_VERSIONS = ("llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2")


@dataclass(frozen=True)
class ClusterApis:
    hpa_version: str = "autoscaling/v2"
    pdb_version: str = "policy/v1"
    pod_monitor: bool = False
    inference_pool: bool = False
    leader_worker_set: bool = False
    model_rewrite_version: str | None = None


def _newest(offered: set[str], wanted: tuple[str, ...]) -> str:
    for version in wanted:
        if version in offered:
            return version
    raise RuntimeError(f"the API server serves none of {', '.join(wanted)}")


def _serves(api: client.ApiClient, offered: set[str], group_version: str, plural: str) -> bool:
    if group_version not in offered:
        return False
    group, version = group_version.split("/")
    resources = client.CustomObjectsApi(api).get_api_resources(group, version).resources
    return any(r.name == plural for r in resources)


def discover(api: client.ApiClient) -> ClusterApis:
    groups = client.ApisApi(api).get_api_versions().groups
    offered = {v.group_version for g in groups for v in g.versions}
    return ClusterApis(
        hpa_version=_newest(offered, HPA_VERSIONS),
        pdb_version=_newest(offered, PDB_VERSIONS),
        pod_monitor=_serves(api, offered, POD_MONITOR_VERSION, "podmonitors"),
        inference_pool=_serves(api, offered, INFERENCE_POOL_VERSION, "inferencepools"),
        leader_worker_set=_serves(api, offered, LEADER_WORKER_SET_VERSION, "leaderworkersets"),
        model_rewrite_version=next(
            (
                version
                for version in MODEL_REWRITE_VERSIONS
                if _serves(api, offered, version, "inferencemodelrewrites")
            ),
            None,
        ),
    )
