"""Bringing one running pod's LoRA adapters to the spec's list, over the pod's own API.

The server lists what it serves on ``GET /v1/models``: the model, and each adapter as an entry
whose ``parent`` is the model and whose ``root`` is the adapter's path. The operator compares
that with the wanted adapters (name → path, ``adapters.Adapter.path``) and calls
``POST /v1/unload_lora_adapter`` for each adapter served but no longer wanted (or wanted from
another path), then ``POST /v1/load_lora_adapter`` for each wanted one not served. The calls go
to the pod's IP on ``HTTP_PORT``, so the operator needs no access to anything but the pods'
network; the server allows them only with ``KVSERVE_ALLOW_RUNTIME_LORA_UPDATING=true``, which
every pod with adapters runs with. A pod started with ``apiKeySecret`` wants that key on every
call: the operator reads it from the Secret (``Kube.secret_value``) and sends it as
``Authorization: Bearer``.

Each call is idempotent in effect: a sync repeated on an up-to-date pod only reads its list.
"""

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvserve.operator.resource import HTTP_PORT

LIST_TIMEOUT_SECONDS = 5.0
"""For ``/v1/models`` and an unload: a pod that does not answer soon is reported, not waited on."""
LOAD_TIMEOUT_SECONDS = 30.0
"""For a load, which reads the adapter's weights (a few MB to a few hundred)."""


@dataclass(frozen=True)
class PodSync:
    """What one pod serves after a sync: the adapters it loaded or already had, and why each
    other wanted adapter is not served (the server's error, or the pod not answering)."""

    served: frozenset[str]
    failed: Mapping[str, str]
    answered: bool = True
    """Whether the server answered, an HTTP error included (e.g. 401 when the key the
    operator sends is not the pod's): it runs, and the status reports what it refused."""


def served_adapters(models: dict[str, Any], base: str) -> dict[str, str]:
    """The adapters in a ``/v1/models`` answer: name → path (``root``), those whose
    ``parent`` is ``base``."""
    return {
        m["id"]: m.get("root") or ""
        for m in models.get("data") or []
        if m.get("parent") == base and m.get("id") != base
    }


def sync_plan(wanted: Mapping[str, str], served: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(to unload, to load), by name, in name order: served but unwanted or from another path,
    then wanted but not served as wanted."""
    unload = sorted(n for n, path in served.items() if wanted.get(n) != path)
    load = sorted(n for n, path in wanted.items() if served.get(n) != path)
    return unload, load


def _error(e: Exception) -> str:
    """The server's OpenAI-shaped error message, else what kept the call from being answered."""
    if isinstance(e, urllib.error.HTTPError):
        try:
            body = json.loads(e.read())
            return f"HTTP {e.code}: {body['error']['message']}"
        except (ValueError, KeyError, TypeError):
            return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return f"not reachable: {e.reason}"
    return str(e) or type(e).__name__


def _call(
    url: str,
    api_key: str | None,
    body: dict[str, Any] | None = None,
    timeout: float = LIST_TIMEOUT_SECONDS,
) -> bytes:
    """The answer's body; an HTTP error status raises (``HTTPError``). A load or an unload
    answers plain text, as vLLM's do."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read()


def _served(root: str, base: str, api_key: str | None) -> dict[str, str]:
    return served_adapters(json.loads(_call(f"{root}/models", api_key)), base)


def sync_pod(
    address: str, base: str, wanted: Mapping[str, str], api_key: str | None = None
) -> PodSync:
    """Bring the server at ``address`` (``host:port``) to ``wanted`` (name → path), every
    call carrying ``api_key`` if given.

    Two syncs of one pod can overlap (a reconcile and a pod's event): the second's load of an
    adapter the first just loaded is refused ("already loaded"). So a failed call is judged by
    the list read again after the calls: what it shows served from the wanted path is served."""
    root = f"http://{address}/v1"
    try:
        served = _served(root, base, api_key)
    except (OSError, ValueError) as e:
        answered = isinstance(e, urllib.error.HTTPError)
        return PodSync(frozenset(), dict.fromkeys(wanted, _error(e)), answered)
    unload, load = sync_plan(wanted, served)
    failed: dict[str, str] = {}
    for name in unload:
        try:
            _call(f"{root}/unload_lora_adapter", api_key, {"lora_name": name})
        except (OSError, ValueError) as e:
            failed[name] = f"unload: {_error(e)}"
    for name in load:
        if name in failed:  # still loaded from its old path: its unload failed
            continue
        try:
            body = {"lora_name": name, "lora_path": wanted[name]}
            _call(f"{root}/load_lora_adapter", api_key, body, LOAD_TIMEOUT_SECONDS)
        except (OSError, ValueError) as e:
            failed[name] = _error(e)
    if not unload and not load:
        return PodSync(frozenset(wanted), {})
    try:
        served = _served(root, base, api_key)
    except (OSError, ValueError) as e:
        answered = isinstance(e, urllib.error.HTTPError)
        return PodSync(frozenset(), dict.fromkeys(wanted, _error(e)), answered)
    now = frozenset(n for n, path in wanted.items() if served.get(n) == path)
    left = {n: failed.get(n, "not served after it was loaded") for n in wanted if n not in now}
    return PodSync(now, left)


def pod_address(pod: dict[str, Any]) -> str | None:
    """``IP:HTTP_PORT`` of a pod whose containers are ready (its server passed its readiness
    probe; the pod itself waits for the adapters' gate) and that is not being deleted, else
    None."""
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "ContainersReady" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if not ready or pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return None
    return f"{status['podIP']}:{HTTP_PORT}"
