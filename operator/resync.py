"""The periodic resync: every LLMDeployment the operator watches, reconciled again.

It repairs drift no event reports (a child edited by hand, a Deployment scaled past the
autoscaler's bounds). It is one operator-level task over kopf's index of the watched
LLMDeployments, not a ``@kopf.timer``: kopf puts a finalizer on every object a timer serves,
which leaves LLMDeployments and their namespaces stuck Terminating while the operator is down.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable

from kubernetes.client.rest import ApiException

from kvserve.operator.kube import api_message, namespace_terminating

log = logging.getLogger(__name__)


async def resync_forever(
    reconcile: Callable[[str, str], None],
    keys: Iterable[tuple[str, str]],
    interval: float,
) -> None:
    """Every ``interval`` seconds, ``reconcile(namespace, name)`` for each of ``keys`` (a live
    view, such as a kopf index), one at a time in a worker thread. A failure is logged; the next
    round tries again."""
    while True:
        await asyncio.sleep(interval)
        for namespace, name in list(keys):
            try:
                await asyncio.to_thread(reconcile, namespace, name)
            except ApiException as e:
                if not namespace_terminating(e):
                    log.warning("resync of %s/%s failed: %s", namespace, name, api_message(e))
            except Exception:
                log.exception("resync of %s/%s failed", namespace, name)
