"""When the operator tries again: backoff after API errors, and the periodic resync."""

import asyncio
import json

from kubernetes.client.rest import ApiException

from kvserve.operator.handlers import retry_delay
from kvserve.operator.kube import api_message, namespace_terminating
from kvserve.operator.resync import resync_forever


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [retry_delay(n) for n in range(9)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def _refusal(status: int, body: dict) -> ApiException:
    error = ApiException(status=status, reason="Forbidden")
    error.body = json.dumps(body)
    return error


TERMINATING = {
    "kind": "Status",
    "message": 'services "q" is forbidden: unable to create new content in namespace ml '
    "because it is being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "q",
        "kind": "services",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace ml is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
    "code": 403,
}


def test_a_terminating_namespace_is_told_from_other_refusals() -> None:
    assert namespace_terminating(_refusal(403, TERMINATING))
    assert api_message(_refusal(403, TERMINATING)) == TERMINATING["message"]
    rbac = {**TERMINATING, "details": {"name": "q", "kind": "services"}}
    assert not namespace_terminating(_refusal(403, rbac))
    assert api_message(ApiException(status=503, reason="Service Unavailable")) == (
        "503 Service Unavailable"
    )


def test_resync_reconciles_every_key_each_round_and_outlives_errors() -> None:
    keys = [("a", "x"), ("b", "y")]
    calls: list[tuple[str, str]] = []

    def reconcile(namespace: str, name: str) -> None:
        calls.append((namespace, name))
        if name == "x":
            raise ApiException(status=500, reason="Internal Server Error")

    async def three_rounds() -> None:
        task = asyncio.create_task(resync_forever(reconcile, keys, 0.01))
        while len(calls) < 6:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(three_rounds(), timeout=10))
    assert calls[:6] == keys * 3
