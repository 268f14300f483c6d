"""Status writes that never go backwards.

Two handlers can compute an LLMDeployment's status at once: the reconcile of a spec change and
the refresh after a child Deployment's event. A status computed from an older read must not
replace one written since (a fresh ``Degraded=True`` flipped back to False ~70 ms later, then
a second identical Event on the next resync). Each write carries the ``resourceVersion`` of the
owner the status was computed from; when the API server answers 409 Conflict, the owner is read
again and the status computed again from what it is now.
"""

from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from kvserve.operator.kube import Kube
from kvserve.operator.reconciler import Outcome

ATTEMPTS = 5


class StatusConflict(Exception):
    """The owner kept changing between each read and the write of its status."""


def write_outcome(
    kube: Kube, owner: dict[str, Any], compute: Callable[[dict[str, Any]], Outcome]
) -> tuple[dict[str, Any], Outcome] | None:
    """Compute ``owner``'s outcome and write its status unless it is already there.

    Returns the version of the owner the written status was computed from, with the outcome;
    None when the owner is gone or being deleted.
    """
    for _ in range(ATTEMPTS):
        outcome = compute(owner)
        if owner.get("status") == outcome.status:
            return owner, outcome
        try:
            kube.patch_status(owner, outcome.status)
            return owner, outcome
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status != 409:
                raise
        meta = owner["metadata"]
        current = kube.get(owner["apiVersion"], owner["kind"], meta["namespace"], meta["name"])
        if current is None or current["metadata"].get("deletionTimestamp"):
            return None
        owner = current
    raise StatusConflict(f"{meta['namespace']}/{meta['name']} changed {ATTEMPTS} times")
