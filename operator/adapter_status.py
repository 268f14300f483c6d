"""``status.adapters`` and the ``AdaptersReady`` condition, from each Ready pod's sync.

Each adapter of the spec has a state over the Ready pods (``adapter_sync.PodSync``):
- ``Failed``: a pod refused it or could not be asked; the message names the first such pod
  (by name) and quotes the error;
- ``Loaded``: every Ready pod serves it (and there is at least one);
- ``Loading``: otherwise (no Ready pod yet).

``AdaptersReady`` is False (``AdapterLoadFailed``) naming the first failed adapter in the
spec's order, True when all are loaded, Unknown while any is loading.
"""

from collections.abc import Mapping
from typing import Any

from kvserve.operator.adapter_sync import PodSync
from kvserve.operator.spec import AdapterSpec

CONDITION = "AdaptersReady"
LOAD_FAILED = "AdapterLoadFailed"


def _entry(adapter: AdapterSpec, pods: Mapping[str, PodSync]) -> dict[str, Any]:
    failed = sorted(
        (name, p.failed[adapter.name]) for name, p in pods.items() if adapter.name in p.failed
    )
    serving = sum(adapter.name in p.served for p in pods.values())
    if failed:
        pod, error = failed[0]
        state, message = "Failed", f"{len(failed)}/{len(pods)} pods failed; {pod}: {error}"
    elif pods and serving == len(pods):
        state, message = "Loaded", f"served by {serving}/{len(pods)} Ready pods"
    else:
        state, message = "Loading", f"served by {serving}/{len(pods)} Ready pods"
    return {"name": adapter.name, "source": adapter.source, "state": state, "message": message}


def adapter_report(
    adapters: list[AdapterSpec], pods: Mapping[str, PodSync]
) -> tuple[list[dict[str, Any]], tuple[bool | None, str, str]]:
    """(``status.adapters``, the condition's (ok, reason, message)) over the Ready pods'
    syncs, by pod name."""
    entries = [_entry(a, pods) for a in adapters]
    failed = next((e for e in entries if e["state"] == "Failed"), None)
    if failed is not None:
        return entries, (False, LOAD_FAILED, f"adapter {failed['name']}: {failed['message']}")
    if all(e["state"] == "Loaded" for e in entries):
        message = f"{len(entries)} adapters loaded on {len(pods)} Ready pods"
        return entries, (True, "Loaded", message)
    loading = ", ".join(e["name"] for e in entries if e["state"] == "Loading")
    return entries, (None, "Loading", f"not yet on every Ready pod: {loading}")
