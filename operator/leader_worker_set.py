"""The LeaderWorkerSet that runs an LLMDeployment whose replica spans several pods.

When ``pods_per_replica`` is above 1 (tensor × pipeline ranks over pods of ``ranks_per_pod``),
each model replica is a group of that many pods forming one ``torch.distributed`` group: the
operator renders a ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet (size = pods per group,
replicas = model replicas) in place of the Deployment. Every pod of a group is the Deployment's
pod (``render_deployment``: same image, volumes, init containers, security), with vLLM's
multi-node flags fed from the variables the LWS controller puts in each container
(``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``; the kubelet expands
``$(NAME)``):

- the leader (worker index 0) runs the API server, the engine core and its local ranks; it
  alone has the HTTP port, the probes, the scrape annotations and the preStop delay, and the
  Service selects leaders only (``LEADER_SELECTOR``);
- a worker runs the same command with ``--headless``: worker ranks only, no HTTP server, so no
  probes;
- the group starts together (``LeaderCreated``: the leader becomes ready only once every rank
  joins, so ``LeaderReady`` would never start the workers) and is recreated whole when any of
  its pods restarts (``RecreateGroupOnPodRestart``: a rank lost breaks the group).

Model sources: an ``hf://`` model is downloaded by each pod's init container into its own
emptyDir (one download per pod); a ``pvc://`` claim is mounted read-only by every pod, so
groups spread over nodes need a ReadOnlyMany (or ReadWriteMany) claim.
"""

from typing import Any

from kvserve.operator.deployment import render_deployment
from kvserve.operator.discovery import LEADER_WORKER_SET_VERSION as LWS_VERSION
from kvserve.operator.resource import child_metadata, selector_labels
from kvserve.operator.spec import LLMDeploymentSpec, ModelSource, pods_per_replica

LWS_KIND = "LeaderWorkerSet"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}
"""Added to the Service's selector: only leaders serve HTTP."""
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
MASTER_PORT = 29500
"""The leader's rendezvous port (torch.distributed's usual one)."""
CONDITION = "LeaderWorkerSet"
MISSING_API = "LeaderWorkerSetAPIMissing"
_LEADER_ONLY = ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle")


def group_args(headless: bool) -> list[str]:
    """vLLM's multi-node flags of a group's pod; ``headless`` for a worker."""
    args = [
        "--nnodes", f"$({GROUP_SIZE_ENV})",
        "--node-rank", f"$({WORKER_INDEX_ENV})",
        "--master-addr", f"$({LEADER_ADDRESS_ENV})",
        "--master-port", str(MASTER_PORT),
    ]  # fmt: skip
    return [*args, "--headless"] if headless else args


def _with_group_args(template: dict[str, Any], headless: bool) -> dict[str, Any]:
    """The Deployment's pod ``template`` as a group's leader's, or (``headless``) a worker's."""
    (server,) = template["spec"]["containers"]
    server = {**server, "args": server["args"] + group_args(headless)}
    metadata = template["metadata"]
    if headless:
        server = {k: v for k, v in server.items() if k not in _LEADER_ONLY}
        metadata = {"labels": metadata["labels"]}
    return {"metadata": metadata, "spec": {**template["spec"], "containers": [server]}}


def render_leader_worker_set(
    owner: dict[str, Any],
    spec: LLMDeploymentSpec,
    source: ModelSource,
    image: str,
    replicas: int,
) -> dict[str, Any]:
    template = render_deployment(owner, spec, source, image, replicas)["spec"]["template"]
    return {
        "apiVersion": LWS_VERSION,
        "kind": LWS_KIND,
        "metadata": child_metadata(owner),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": pods_per_replica(spec),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _with_group_args(template, headless=False),
                "workerTemplate": _with_group_args(template, headless=True),
            },
        },
    }


def leader_selector(name: str) -> dict[str, str]:
    """The Service's selector for a group's leaders."""
    return {**selector_labels(name), **LEADER_SELECTOR}


def lws_condition(api_served: bool, size: int) -> tuple[bool, str, str]:
    """(ok, reason, message) of the ``LeaderWorkerSet`` condition, for a spec of groups."""
    if not api_served:
        return (
            False,
            MISSING_API,
            f"each replica needs {size} pods, but the cluster serves no {LWS_VERSION} "
            "LeaderWorkerSet API: install LeaderWorkerSet (its CRD and controller; the "
            "LeaderWorkerSet is made at the next reconcile after that)",
        )
    return (True, "GroupsApplied", f"each replica is a LeaderWorkerSet group of {size} pods")
