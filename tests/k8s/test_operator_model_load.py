"""ModelLoaded and modelLoadSeconds, computed from pod objects as the API serves them."""

from typing import Any

import pytest

from k8s.support import owner
from kvserve.operator import status as status_module
from kvserve.operator.model_load import ModelLoad, model_load
from kvserve.operator.status import build_status

STARTED = "2026-01-01T00:00:10Z"


def pod(
    name: str,
    ready_at: str | None = None,
    server: dict[str, Any] | None = None,
    fetch: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod of the LLMDeployment: the server container's status (``server``: a container
    status without its name; default running since ``STARTED``), Ready since ``ready_at``."""
    container = server if server is not None else {"state": {"running": {"startedAt": STARTED}}}
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": STARTED},
            {
                "type": "Ready",
                "status": "True" if ready_at else "False",
                "lastTransitionTime": ready_at or STARTED,
            },
        ],
        "containerStatuses": [{"name": "server", "restartCount": 0, **container}],
    }
    if fetch is not None:
        status["initContainerStatuses"] = [{"name": "fetch-model", "restartCount": 0, **fetch}]
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:09:00Z"
    return {"metadata": meta, "status": status}


def crashed(exit_code: int, reason: str, message: str, restarts: int = 3) -> dict[str, Any]:
    return {
        "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "message": message,
                "startedAt": STARTED,
                "finishedAt": "2026-01-01T00:00:14Z",
            }
        },
    }


def test_loaded_reports_the_pod_ready_last() -> None:
    pods = [
        pod("demo-b", ready_at="2026-01-01T00:00:52Z"),
        pod("demo-a", ready_at="2026-01-01T00:00:31Z"),
    ]
    assert model_load(pods) == ModelLoad(
        True,
        "Loaded",
        "2/2 pods loaded the model; the last, demo-b, in 42s from its server's start to Ready",
        42,
    )


def test_download_time_from_the_init_container() -> None:
    fetched = {"state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                        "startedAt": "2026-01-01T00:00:00Z",
                                        "finishedAt": "2026-01-01T00:00:09Z"}}}  # fmt: skip
    loaded = model_load([pod("demo-a", ready_at="2026-01-01T00:00:17Z", fetch=fetched)])
    assert loaded.message == (
        "1/1 pods loaded the model; the last, demo-a, in 7s from its server's start to Ready "
        "(after a 9s download)"
    )
    assert loaded.seconds == 7


def test_a_crash_loop_is_false_with_the_exit_and_the_log_tail() -> None:
    log = "loading weights\nTraceback (most recent call last):\n  ...\nValueError: bad config\n"
    pods = [
        pod("demo-a", ready_at="2026-01-01T00:00:31Z"),
        pod("demo-b", server=crashed(1, "Error", log)),
    ]
    assert model_load(pods) == ModelLoad(
        False,
        "Error",
        "1/2 pods failed to load; demo-b: container server exited with code 1 (Error), restarted "
        "3 times: Traceback (most recent call last): | ... | ValueError: bad config",
    )


def test_out_of_memory_while_running_again() -> None:
    again = crashed(137, "OOMKilled", "", restarts=1)
    again["state"] = {"running": {"startedAt": "2026-01-01T00:00:20Z"}}
    assert model_load([pod("demo-a", server=again)]) == ModelLoad(
        False,
        "OOMKilled",
        "1/1 pods failed to load; demo-a: container server exited with code 137 (OOMKilled), "
        "restarted 1 times",
    )


def test_a_failed_download_quotes_the_line_naming_its_cause() -> None:
    """The message is what fetch_model writes to the termination log (test_operator_fetch_model
    checks the line; tests/e2e sees the kubelet carry it)."""
    line = (
        "cannot download org/name from http://hub.invalid: [Errno -3] Temporary "
        "failure in name resolution (raised as LocalEntryNotFoundError)\n"
    )
    failed = crashed(1, "Error", line, restarts=2)
    waiting = {"state": {"waiting": {"reason": "PodInitializing"}}}
    assert model_load([pod("demo-a", server=waiting, fetch=failed)]) == ModelLoad(
        False,
        "DownloadFailed",
        "1/1 pods failed to load; demo-a: container fetch-model exited with code 1 (Error), "
        "restarted 2 times: cannot download org/name from http://hub.invalid: [Errno -3] "
        "Temporary failure in name resolution (raised as LocalEntryNotFoundError)",
    )


def test_a_failed_adapter_download_fails_the_pod_by_its_container() -> None:
    line = "cannot download org/sql-lora from http://hub.invalid: RepositoryNotFoundError: 404\n"
    p = pod("demo-a", server={"state": {"waiting": {"reason": "PodInitializing"}}})
    model = {"name": "fetch-model", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}
    adapter = {"name": "fetch-adapter-sql", **crashed(1, "Error", line, restarts=1)}
    p["status"]["initContainerStatuses"] = [model, adapter]
    assert model_load([p]) == ModelLoad(
        False,
        "DownloadFailed",
        "1/1 pods failed to load; demo-a: container fetch-adapter-sql exited with code 1 "
        "(Error), restarted 1 times: cannot download org/sql-lora from http://hub.invalid: "
        "RepositoryNotFoundError: 404",
    )


def test_an_image_that_cannot_be_pulled() -> None:
    pull = {"state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": 'Back-off pulling image "kvserve:nope"'}}}  # fmt: skip
    assert model_load([pod("demo-a", server=pull)]) == ModelLoad(
        False,
        "ImagePullBackOff",
        '1/1 pods failed to load; demo-a: container server: Back-off pulling image "kvserve:nope"',
    )


def test_starting_pods_none_and_deleted_ones_are_unknown() -> None:
    creating = {"state": {"waiting": {"reason": "ContainerCreating"}}}
    assert model_load([pod("demo-a", server=creating), pod("demo-b")]) == ModelLoad(
        None, "Loading", "0/2 pods loaded the model yet"
    )
    assert model_load([]) == ModelLoad(None, "NoPods", "no pod runs the model")
    gone = pod("demo-a", server=crashed(1, "Error", "x"), deleting=True)
    assert model_load([gone]) == ModelLoad(None, "NoPods", "no pod runs the model")


def test_a_pod_that_is_ready_again_after_a_crash_is_loaded() -> None:
    recovered = crashed(1, "Error", "x", restarts=1)
    recovered["state"] = {"running": {"startedAt": "2026-01-01T00:01:00Z"}}
    loaded = model_load([pod("demo-a", ready_at="2026-01-01T00:01:12Z", server=recovered)])
    assert (loaded.loaded, loaded.seconds) == (True, 12)


def test_status_carries_the_condition_and_keeps_the_last_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_module, "_now", lambda: "2026-01-01T00:05:00Z")
    body = owner("cpu-demo.yaml")
    status = build_status(body, None, pods=[pod("demo-a", ready_at="2026-01-01T00:00:31Z")])
    assert status["modelLoadSeconds"] == 21
    assert status["conditions"][-1] == {
        "type": "ModelLoaded",
        "status": "True",
        "reason": "Loaded",
        "message": "1/1 pods loaded the model; the last, demo-a, in 21s from its server's start "
        "to Ready",
        "lastTransitionTime": "2026-01-01T00:05:00Z",
    }
    body["status"] = status
    scaled_to_zero = build_status(body, None, pods=[])
    assert scaled_to_zero["modelLoadSeconds"] == 21
    assert scaled_to_zero["conditions"][-1]["status"] == "Unknown"
    assert "modelLoadSeconds" not in build_status(owner("cpu-demo.yaml"), None, pods=[])
