"""Whether an LLMDeployment's pods loaded the model, and how long it took, from the pods' status.

A pod's load time runs from its server container's start (``state.running.startedAt``: after
the image pull and the model download) to its ``Ready`` condition (``lastTransitionTime``),
so it holds the server's whole start (imports, weights, KV allocation, warm-up) plus up to one
readiness period (5 s). The API server keeps both times to the second.

- ``True`` (``Loaded``): no pod failed and at least one is Ready; the time is the pod that
  became Ready last.
- ``False``: a pod that is not Ready has a server container that terminated (now or before its
  last restart, any exit code) or cannot start (a waiting reason other than ``ContainerCreating``
  and ``PodInitializing``, such as ``CrashLoopBackOff`` or ``ImagePullBackOff``): the reason is
  the kubelet's (``OOMKilled``, ``Error``, ...); or a download (the model's init container,
  or an ``hf://`` adapter's) exited with an error: reason ``DownloadFailed``, the kubelet's in
  the message. The message
  quotes the termination message: for the download, the line ``fetch_model`` writes naming the
  cause; for the server, its log's tail.
- ``Unknown``: pods are starting (``Loading``), or there are none (``NoPods``).

Pods being deleted are left out.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvserve.operator.adapters import FETCH_ADAPTER_PREFIX
from kvserve.operator.deployment import FETCH_CONTAINER, SERVER_CONTAINER

CONDITION = "ModelLoaded"
STARTING = ("ContainerCreating", "PodInitializing")
QUOTED_LINES = 3
QUOTED_CHARS = 400
DOWNLOAD_FAILED = "DownloadFailed"


@dataclass(frozen=True)
class ModelLoad:
    loaded: bool | None
    """The condition's status: True, False, or None for Unknown."""
    reason: str
    message: str
    seconds: int | None = None
    """The load time of the pod that became Ready last, when ``loaded``."""


def _seconds(start: str, end: str) -> int:
    def parse(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return max(0, round((parse(end) - parse(start)).total_seconds()))


def _ready_since(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("lastTransitionTime") if c.get("status") == "True" else None
    return None


def _container(pod: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get(kind) or []
    return next((s for s in statuses if s.get("name") == name), {})


def _quote(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    tail = " | ".join(lines[-QUOTED_LINES:])
    return tail if len(tail) <= QUOTED_CHARS else "..." + tail[-QUOTED_CHARS:]


def _terminated(name: str, ended: dict[str, Any], restarts: int) -> tuple[str, str]:
    reason = ended.get("reason") or "Error"
    text = f"container {name} exited with code {ended.get('exitCode')} ({reason})"
    if restarts:
        text += f", restarted {restarts} times"
    quoted = _quote(ended.get("message"))
    return reason, f"{text}: {quoted}" if quoted else text


def _failure(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of why ``pod`` failed to load the model, or None."""
    if _ready_since(pod) is not None:
        return None
    for fetch in (pod.get("status") or {}).get("initContainerStatuses") or []:
        name = fetch.get("name", "")
        if name != FETCH_CONTAINER and not name.startswith(FETCH_ADAPTER_PREFIX):
            continue
        fetch_ended = (fetch.get("state") or {}).get("terminated") or (
            fetch.get("lastState") or {}
        ).get("terminated")
        if fetch_ended and fetch_ended.get("exitCode"):
            _, message = _terminated(name, fetch_ended, fetch.get("restartCount", 0))
            return DOWNLOAD_FAILED, message
    server = _container(pod, "containerStatuses", SERVER_CONTAINER)
    state, last = server.get("state") or {}, server.get("lastState") or {}
    ended = state.get("terminated") or last.get("terminated")
    if ended:
        return _terminated(SERVER_CONTAINER, ended, server.get("restartCount", 0))
    waiting = state.get("waiting") or {}
    if waiting.get("reason") and waiting["reason"] not in STARTING:
        message = waiting.get("message") or "waiting"
        return waiting["reason"], f"container {SERVER_CONTAINER}: {_quote(message)}"
    return None


def _load(pod: dict[str, Any]) -> tuple[str, str, int, int | None] | None:
    """(Ready since, pod name, load seconds, download seconds) of a Ready pod."""
    ready = _ready_since(pod)
    running = (_container(pod, "containerStatuses", SERVER_CONTAINER).get("state") or {}).get(
        "running"
    ) or {}
    if ready is None or "startedAt" not in running:
        return None
    fetch = _container(pod, "initContainerStatuses", FETCH_CONTAINER)
    fetched = (fetch.get("state") or {}).get("terminated") or {}
    download = None
    if fetched.get("exitCode") == 0 and "startedAt" in fetched and "finishedAt" in fetched:
        download = _seconds(fetched["startedAt"], fetched["finishedAt"])
    return ready, pod["metadata"]["name"], _seconds(running["startedAt"], ready), download


def model_load(pods: list[dict[str, Any]]) -> ModelLoad:
    live = sorted(
        (p for p in pods if not p["metadata"].get("deletionTimestamp")),
        key=lambda p: p["metadata"]["name"],
    )
    failures = [(p["metadata"]["name"], f) for p in live if (f := _failure(p)) is not None]
    if failures:
        name, (reason, message) = failures[0]
        return ModelLoad(
            False, reason, f"{len(failures)}/{len(live)} pods failed to load; {name}: {message}"
        )
    loads = sorted(load for p in live if (load := _load(p)) is not None)
    if loads:
        _, name, seconds, download = loads[-1]
        message = (
            f"{len(loads)}/{len(live)} pods loaded the model; the last, {name}, in {seconds}s "
            "from its server's start to Ready"
        )
        if download is not None:
            message += f" (after a {download}s download)"
        return ModelLoad(True, "Loaded", message, seconds)
    if not live:
        return ModelLoad(None, "NoPods", "no pod runs the model")
    return ModelLoad(None, "Loading", f"0/{len(live)} pods loaded the model yet")
