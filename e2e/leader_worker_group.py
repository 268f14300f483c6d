"""The multi-node scenario on a cluster without a LeaderWorkerSet controller (Kubernetes 1.20).

An LLMDeployment whose replica spans two pods (tensor parallel 2, one rank per pod, on the
CPU: gloo) gets the ``LeaderWorkerSetAPIMissing`` condition, one Warning Event and no workload;
its Service (leaders only) is made. The scenario then plays the LWS controller: from the
LeaderWorkerSet the operator renders where that API exists, it makes the group's leader and
worker pods, each with the template's labels and containers plus what the controller adds (its
labels, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``). One deviation: the
controller's leader address is a DNS name (``NAME-0.NAME.NS``) and this node has no cluster DNS,
so the worker gets the leader pod's IP and the leader its own (downward API).

The two pods serve as one model: the leader turns Ready only once the worker's rank joined; the
worker holds a connection to the leader; the leader's Service answers with the same greedy
tokens as one pod running both ranks; and when the worker is lost, the leader turns dead.
"""

import dataclasses
from typing import Any

import yaml
from cluster import wait_for
from kubernetes.client import V1Pod
from rollout import HTTP_PORT
from scenarios import (
    API,
    CHILD_KINDS,
    READY_TIMEOUT,
    Context,
    _answers,
    _ready,
    _warnings,
    condition,
    demo_spec,
    wait_ready,
)
from traffic import MODEL, openai_client, stream_completion

from kvserve.operator.leader_worker_set import (
    GROUP_SIZE_ENV,
    LEADER_ADDRESS_ENV,
    LEADER_SELECTOR,
    WORKER_INDEX_ENV,
    WORKER_INDEX_LABEL,
    render_leader_worker_set,
)
from kvserve.operator.validation import validated

LWS_LABELS = "leaderworkerset.sigs.k8s.io"
LOST_WORKER_BOUND = 120.0
"""Seconds within which the leader must turn dead once its worker is gone."""
PROMPT = "The capital of France is"
CONNECTED_TO = (
    "import sys; ip = bytes(map(int, sys.argv[1].split('.')))[::-1].hex().upper(); "
    "peers = (ip, '0000000000000000FFFF0000' + ip); "
    "print(sum(line.split()[2].split(':')[0] in peers and line.split()[3] == '01' "
    "for f in ('/proc/net/tcp', '/proc/net/tcp6') for line in open(f).readlines()[1:]))"
)
"""Counts the pod's established TCP connections to the IPv4 address argv[1] (as IPv4, or
IPv4-mapped IPv6: /proc/net shows each 32-bit word in the host's byte order)."""


def _group_spec(ranks_per_pod: int | None) -> dict[str, Any]:
    """The demo at TP=2: both ranks in one pod (1 CPU, 2Gi, as ``tensor-parallel-cpu``), or
    ``ranks_per_pod`` each in pods of 500m and 1536Mi."""
    spec = demo_spec() | {"engine": {"maxNumSeqs": 8, "tensorParallelSize": 2}}
    spec["resources"] = {"cpu": "1", "memory": "2Gi"}
    if ranks_per_pod is not None:
        spec["resources"] = {"cpu": "500m", "memory": "1536Mi", "ranksPerPod": ranks_per_pod}
    return spec


def _apply(ctx: Context, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
            "metadata": {"name": ctx.name}, "spec": spec}  # fmt: skip
    ctx.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))


def _greedy(ctx: Context) -> str:
    """16 greedy tokens (EOS ignored) through the LLMDeployment's Service."""
    url = ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT)
    with url as base, openai_client(base) as ai:
        answer = ai.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    (choice,) = answer.choices
    assert (choice.finish_reason, answer.usage and answer.usage.completion_tokens) == (
        "length",
        16,
    ), answer
    return choice.text


def _delete(ctx: Context) -> None:
    ctx.kubectl("delete", "llmd", ctx.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not ctx.kubectl("get", CHILD_KINDS, "-l", ctx.selector, "-o", "name").strip(),
             f"every child of {ctx.name} collected", 180)  # fmt: skip


def _group_pod(
    template: dict[str, Any], name: str, index: int, env: list[dict[str, Any]]
) -> dict[str, Any]:
    """A pod of group 0 as the LWS controller makes it from ``template``."""
    labels = {
        **template["metadata"]["labels"],
        f"{LWS_LABELS}/name": name,
        f"{LWS_LABELS}/group-index": "0",
        WORKER_INDEX_LABEL: str(index),
    }
    spec = dict(template["spec"])
    spec["containers"] = [{**c, "env": [*c.get("env", []), *env]} for c in spec["containers"]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name + ("-0" if index == 0 else f"-0-{index}"),
            "labels": labels,
            "annotations": template["metadata"].get("annotations", {}),
        },
        "spec": spec,
    }


def _pod(ctx: Context, name: str) -> V1Pod:
    return ctx.cluster.core.read_namespaced_pod(name, ctx.namespace)


def leader_worker_group_serves_as_one_model(ctx: Context) -> str:
    grp = dataclasses.replace(ctx, name=f"{ctx.name}-group")

    # The same two ranks in one pod: the tokens the group must give.
    _apply(grp, _group_spec(ranks_per_pod=None))
    wait_ready(grp, 1)
    expected = _greedy(grp)
    _delete(grp)

    # Two pods of one rank: no LeaderWorkerSet API here, so a condition, one Event, no workload.
    _apply(grp, _group_spec(ranks_per_pod=1))
    missing = wait_for(lambda: condition(grp.llmd(), "LeaderWorkerSet"), "the condition", 60)
    assert (missing["status"], missing["reason"]) == ("False", "LeaderWorkerSetAPIMissing"), missing
    owner = grp.llmd()
    uid = owner["metadata"]["uid"]
    warning = [("Warning", "LeaderWorkerSetAPIMissing", missing["message"])]
    assert wait_for(lambda: _warnings(grp, uid), "the Event", 60) == warning
    assert not grp.kubectl("get", "deployments", "-l", grp.selector, "-o", "name").strip()
    service = grp.cluster.core.read_namespaced_service(grp.name, grp.namespace)
    assert service.spec.selector[WORKER_INDEX_LABEL] == LEADER_SELECTOR[WORKER_INDEX_LABEL]

    # Play the controller with the operator's own LeaderWorkerSet.
    spec, source = validated(owner)
    lws = render_leader_worker_set(owner, spec, source, ctx.image, 1)["spec"]
    size = lws["leaderWorkerTemplate"]["size"]
    assert size == 2, lws
    group = [{"name": GROUP_SIZE_ENV, "value": str(size)}]
    own_ip = {"name": LEADER_ADDRESS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    leader = _group_pod(
        lws["leaderWorkerTemplate"]["leaderTemplate"],
        grp.name,
        0,
        [*group, {"name": WORKER_INDEX_ENV, "value": "0"}, own_ip],
    )
    grp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(leader))
    leader_name = leader["metadata"]["name"]
    leader_ip = wait_for(lambda: _pod(grp, leader_name).status.pod_ip, "the leader's IP", 120)
    worker = _group_pod(
        lws["leaderWorkerTemplate"]["workerTemplate"],
        grp.name,
        1,
        [*group, {"name": WORKER_INDEX_ENV, "value": "1"},
         {"name": LEADER_ADDRESS_ENV, "value": leader_ip}],
    )  # fmt: skip
    grp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(worker))
    worker_name = worker["metadata"]["name"]
    assert "--headless" in worker["spec"]["containers"][0]["args"]

    wait_for(lambda: _ready(_pod(grp, leader_name)), "the leader Ready", READY_TIMEOUT)
    wait_for(lambda: _answers(grp), "the leader's Service to answer", 60)
    joined = grp.kubectl("exec", worker_name, "--", "python", "-c", CONNECTED_TO, leader_ip)
    assert int(joined) >= 1, joined
    answered = _greedy(grp)
    assert answered == expected, (answered, expected)
    with grp.cluster.service_url(grp.namespace, grp.name, HTTP_PORT) as base:
        stream = stream_completion(base, "group", 32)
    assert stream.complete(32), stream

    # A lost worker turns the leader dead (not Ready, or its server restarted).
    grp.kubectl("delete", "pod", worker_name, "--wait=true", "--timeout=60s")

    def dead() -> bool:
        pod = _pod(grp, leader_name)
        restarts = sum(s.restart_count for s in pod.status.container_statuses or [])
        return restarts > 0 or not _ready(pod)

    wait_for(dead, "the leader dead without its worker", LOST_WORKER_BOUND)
    grp.kubectl("delete", "pod", leader_name, "--wait=true", "--timeout=60s")
    _delete(grp)
    return (
        f"leader {leader_name} + headless worker {worker_name}: TP=2 over two pods, "
        f"16 greedy tokens equal to one pod's ({answered!r}); leader dead once the worker was lost"
    )
