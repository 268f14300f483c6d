"""Every check an LLMDeployment passes before the operator applies anything to the cluster.

Its name can name every child (``names``), its spec parses within the bounds the CRD's schema
cannot state (``spec.parse_spec``), its ``extraArgs`` leave the flags the operator renders alone
(``owned_flags``), and the server would start with the container the spec renders
(``server_args``). The parser sees ``serve_args``: not the flags of a pipeline or of a
LeaderWorkerSet's group (``deployment.pipeline_args``, ``leader_worker_set.group_args``), whose
values the operator sets (``parallelism_problem`` checks the sizes) or the kubelet expands from
the group's variables (``$(LWS_GROUP_SIZE)``, which no parser can read). A failed check
raises ``InvalidSpec``: the operator reports it as ``Degraded`` with one Event, and leaves
whatever runs from an earlier valid spec running.
"""

from typing import Any

from kvserve.operator.deployment import serve_args, server_env
from kvserve.operator.names import name_problem
from kvserve.operator.owned_flags import owned_flags_problem
from kvserve.operator.server_args import server_refusal
from kvserve.operator.spec import (
    InvalidSpec,
    LLMDeploymentSpec,
    ModelSource,
    adapters_problem,
    parse_spec,
    pods_per_replica,
)


class InvalidName(InvalidSpec):
    reason = "InvalidName"


def validated(owner: dict[str, Any]) -> tuple[LLMDeploymentSpec, ModelSource]:
    name = owner["metadata"]["name"]
    problem = name_problem(name)
    if problem is not None:
        raise InvalidName(problem)
    spec, source = parse_spec(dict(owner["spec"]))
    adapters = adapters_problem(spec, name)
    if adapters is not None:
        raise InvalidSpec(adapters)
    pods = pods_per_replica(spec)
    if spec.adapters and pods > 1:
        raise InvalidSpec(
            f"adapters are not served by a replica of {pods} pods (a LeaderWorkerSet group) "
            "yet: serve them from replicas of one pod"
        )
    owned = owned_flags_problem(spec.extra_args)
    if owned is not None:
        raise InvalidSpec(owned)
    refusal = server_refusal(serve_args(name, spec, source), server_env(spec))
    if refusal is not None:
        raise InvalidSpec(f"kvserve serve would refuse to start: {refusal}")
    return spec, source
