"""Status from a Deployment's status: phase, counts, conditions and their transition times."""

from typing import Any

import pytest

from k8s.support import owner
from kvserve.operator import status as status_module
from kvserve.operator.status import build_status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_module, "_now", lambda: T1)


def deployment(desired: int, replicas: int, updated: int, ready: int, observed: int = 3) -> dict:
    return {
        "metadata": {"generation": 3},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
        },
    }


def conditions(status: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]]


def test_ready() -> None:
    status = build_status(owner("cpu-demo.yaml", generation=4), deployment(2, 2, 2, 2))
    assert status == {
        "phase": "Ready",
        "replicas": 2,
        "readyReplicas": 2,
        "selector": "app.kubernetes.io/name=kvserve,kvserve.io/llmdeployment=cpu-demo",
        "endpoint": "http://cpu-demo.ml.svc:8000/v1",
        "observedGeneration": 4,
        "conditions": [
            {
                "type": "Available",
                "status": "True",
                "reason": "MinimumReplicasAvailable",
                "message": "2/2 replicas ready",
                "lastTransitionTime": T1,
            },
            {
                "type": "Progressing",
                "status": "False",
                "reason": "RolloutComplete",
                "message": "2 replicas updated and ready",
                "lastTransitionTime": T1,
            },
            {
                "type": "Degraded",
                "status": "False",
                "reason": "Reconciled",
                "message": "the spec is reconciled",
                "lastTransitionTime": T1,
            },
            {
                "type": "ModelLoaded",
                "status": "Unknown",
                "reason": "NoPods",
                "message": "no pod runs the model",
                "lastTransitionTime": T1,
            },
        ],
    }


def test_rolling_out_with_one_ready() -> None:
    status = build_status(owner("cpu-demo.yaml"), deployment(2, 3, 1, 2))
    assert status["phase"] == "Progressing"
    assert conditions(status) == [
        ("Available", "True", "MinimumReplicasAvailable", "2/2 replicas ready"),
        ("Progressing", "True", "RollingOut", "1/2 replicas updated, 2 ready, 3 in total"),
        ("Degraded", "False", "Reconciled", "the spec is reconciled"),
        ("ModelLoaded", "Unknown", "NoPods", "no pod runs the model"),
    ]


def test_stale_deployment_status_is_progressing() -> None:
    status = build_status(owner("cpu-demo.yaml"), deployment(2, 2, 2, 2, observed=2))
    assert status["phase"] == "Progressing"


def test_no_deployment_and_no_ready_pods() -> None:
    assert conditions(build_status(owner("cpu-demo.yaml"), None))[0] == (
        "Available",
        "False",
        "NoDeployment",
        "no Deployment yet",
    )
    pending = build_status(owner("cpu-demo.yaml"), deployment(2, 2, 2, 0))
    assert pending["phase"] == "Progressing"
    assert conditions(pending)[0] == ("Available", "False", "NoReplicasReady", "0/2 replicas ready")


def test_scaled_to_zero_is_a_phase_of_its_own() -> None:
    status = build_status(owner("cpu-demo.yaml"), deployment(0, 0, 0, 0))
    assert (status["phase"], status["replicas"], status["readyReplicas"]) == ("ScaledToZero", 0, 0)
    assert conditions(status) == [
        ("Available", "False", "ScaledToZero", "0 replicas wanted"),
        ("Progressing", "False", "RolloutComplete", "0 replicas updated and ready"),
        ("Degraded", "False", "Reconciled", "the spec is reconciled"),
        ("ModelLoaded", "Unknown", "NoPods", "no pod runs the model"),
    ]


def test_scaling_to_zero_progresses_until_the_deployment_has_no_pod() -> None:
    assert build_status(owner("cpu-demo.yaml"), deployment(0, 1, 0, 1))["phase"] == "Progressing"


def test_degraded_keeps_counts_of_running_pods() -> None:
    problem = (
        "InvalidSpec",
        "autoscaling.minReplicas (5) is greater than autoscaling.maxReplicas (2)",
    )
    status = build_status(owner("cpu-demo.yaml", generation=7), deployment(2, 2, 2, 2), problem)
    assert (status["phase"], status["readyReplicas"], status["observedGeneration"]) == (
        "Degraded",
        2,
        7,
    )
    assert conditions(status)[2] == ("Degraded", "True", *problem)


def test_transition_time_moves_only_when_status_flips() -> None:
    body = owner("cpu-demo.yaml")
    body["status"] = {
        "conditions": [
            {
                "type": "Available",
                "status": "True",
                "reason": "R",
                "message": "m",
                "lastTransitionTime": T0,
            },
            {
                "type": "Progressing",
                "status": "True",
                "reason": "R",
                "message": "m",
                "lastTransitionTime": T0,
            },
        ]
    }
    status = build_status(body, deployment(2, 2, 2, 1))
    times = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}
    assert times == {"Available": T0, "Progressing": T0, "Degraded": T1, "ModelLoaded": T1}
    body["status"] = status
    assert build_status(body, deployment(2, 2, 2, 1)) == status
    settled = build_status(body, deployment(2, 2, 2, 2))
    assert {c["type"]: c["lastTransitionTime"] for c in settled["conditions"]} == {
        "Available": T0,
        "Progressing": T1,
        "Degraded": T1,
        "ModelLoaded": T1,
    }
