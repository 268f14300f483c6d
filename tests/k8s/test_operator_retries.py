"""When the operator tries again: backoff after API errors, and the periodic resync."""

import asyncio
import json
import logging
from types import SimpleNamespace

import kopf
import pytest
from kubernetes.client.rest import ApiException

from kvserve.operator import handlers
from kvserve.operator.handlers import retry_delay
from kvserve.operator.kube import api_message, namespace_terminating
from kvserve.operator.resync import resync_forever
from kvserve.operator.status_write import StatusConflict


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


def test_a_child_event_whose_status_write_keeps_conflicting_ends_quietly(monkeypatch, caplog):
    """Other writers won every race for the owner's status: the event ends at once, with one
    info line and no exception for kopf to log as a traceback."""
    calls = []

    def conflicting(reconciler, body, deleted):
        calls.append(deleted)
        raise StatusConflict("ml/q changed 5 times")

    monkeypatch.setattr(handlers, "_handle_child", conflicting)
    logger = logging.getLogger("test-child-event")
    pod = {"kind": "Pod", "metadata": {"namespace": "ml", "name": "q-1"}}
    with caplog.at_level(logging.INFO, logger=logger.name):
        asyncio.run(
            handlers.child_changed(
                event={"type": "MODIFIED"},
                body=pod,
                memo=SimpleNamespace(reconciler=None),
                logger=logger,
            )
        )
    assert calls == [False]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "child event: status left to the newer writers (ml/q changed 5 times)")
    ]


def test_a_reconcile_whose_status_write_keeps_conflicting_is_retried_later(monkeypatch):
    """The owner kept changing under every status write: kopf is asked to try again after
    the backoff (a TemporaryError, which it logs in one line, no traceback)."""

    def conflicting(reconciler, owner):
        raise StatusConflict("ml/q changed 5 times")

    monkeypatch.setattr(handlers, "_reconcile", conflicting)
    with pytest.raises(kopf.TemporaryError) as raised:
        handlers.reconcile(
            body={"metadata": {"namespace": "ml", "name": "q"}},
            memo=SimpleNamespace(reconciler=None),
            retry=2,
            logger=logging.getLogger("test-reconcile"),
        )
    assert (str(raised.value), raised.value.delay) == ("ml/q changed 5 times", 4)
