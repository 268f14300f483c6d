"""``spec.adapters`` in the pod template: what rolls the pods and what does not, field by field."""

from typing import Any

import pytest

from k8s.support import crd_validator, owner
from kvserve.operator.children import desired_children
from kvserve.operator.deployment import FETCH_SCRIPT
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.spec import InvalidSpec, adapters_problem, parse_spec
from kvserve.operator.validation import validated

IMAGE_ADAPTERS = [
    {"name": "pirate", "source": "/opt/kvserve/adapters/pirate"},
    {"name": "poet", "source": "pvc://loras/poet"},
]


def with_adapters(adapters: list[dict[str, str]]) -> dict[str, Any]:
    body = owner("cpu-demo.yaml")
    body["spec"]["adapters"] = [dict(a) for a in adapters]  # tests edit them
    return body


def pod(body: dict[str, Any]) -> dict[str, Any]:
    spec, source = parse_spec(body["spec"])
    children = desired_children(body, spec, source, ClusterApis(), "kvserve:0.1.0", None)
    return children[0]["spec"]["template"]["spec"]


def server(body: dict[str, Any]) -> dict[str, Any]:
    return pod(body)["containers"][0]


def test_image_and_pvc_adapters_enable_lora_and_mount_the_claim_read_only() -> None:
    s = server(with_adapters(IMAGE_ADAPTERS))
    assert s["args"][-1:] == ["--enable-lora"]
    assert s["env"][-1] == {"name": "KVSERVE_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"}
    assert s["volumeMounts"][-1] == {
        "name": "adapters-claim-0",
        "mountPath": "/adapters/pvc/loras",
        "readOnly": True,
    }
    assert pod(with_adapters(IMAGE_ADAPTERS))["volumes"][-1] == {
        "name": "adapters-claim-0",
        "persistentVolumeClaim": {"claimName": "loras", "readOnly": True},
    }
    assert "initContainers" not in pod(with_adapters(IMAGE_ADAPTERS))
    gates = pod(with_adapters(IMAGE_ADAPTERS))["readinessGates"]
    assert gates == [{"conditionType": "kvserve.io/adapters-synced"}]


def test_another_adapter_from_the_image_or_a_mounted_claim_leaves_the_template_alone() -> None:
    more = [*IMAGE_ADAPTERS, {"name": "sage", "source": "/opt/kvserve/adapters/sage"}]
    more.append({"name": "bard", "source": "pvc://loras/bard"})
    assert pod(with_adapters(more)) == pod(with_adapters(IMAGE_ADAPTERS))
    assert pod(with_adapters(IMAGE_ADAPTERS[:1])) == pod(with_adapters(IMAGE_ADAPTERS[:1][::-1]))


def test_hf_adapter_is_downloaded_by_its_init_container_and_served_from_start() -> None:
    body = with_adapters([*IMAGE_ADAPTERS, {"name": "sql", "source": "hf://org/sql-lora"}])
    p = pod(body)
    assert p["initContainers"] == [
        {
            "name": "fetch-adapter-sql",
            "image": "kvserve:0.1.0",
            "command": ["python", "-c", FETCH_SCRIPT],
            "args": ["org/sql-lora", "", "/adapters/hf/sql"],
            "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/hf"}],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "adapters-hf", "mountPath": "/adapters/hf"},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    s = p["containers"][0]
    assert s["args"][-3:] == ["--enable-lora", "--lora-modules", "sql=/adapters/hf/sql"]
    assert s["volumeMounts"][-2:] == [
        {"name": "adapters-hf", "mountPath": "/adapters/hf", "readOnly": True},
        {"name": "adapters-claim-0", "mountPath": "/adapters/pvc/loras", "readOnly": True},
    ]
    assert p["volumes"][-2] == {"name": "adapters-hf", "emptyDir": {}}


def test_hf_model_keeps_its_download_first() -> None:
    body = owner("hf-gpu-autoscaled.yaml")
    body["spec"]["adapters"] = [{"name": "sql", "source": "hf://org/sql-lora"}]
    names = [c["name"] for c in pod(body)["initContainers"]]
    assert names == ["fetch-model", "fetch-adapter-sql"]


def test_no_adapters_no_lora_flags() -> None:
    s = server(owner("cpu-demo.yaml"))
    assert "--enable-lora" not in s["args"]
    assert all(e["name"] != "KVSERVE_ALLOW_RUNTIME_LORA_UPDATING" for e in s["env"])
    assert "readinessGates" not in pod(owner("cpu-demo.yaml"))


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        (
            [{"name": "Pirate", "source": "/a"}],
            "adapters[0].name 'Pirate' is not a DNS label of 49 characters at most (a-z, 0-9, '-')",
        ),
        (
            [{"name": "a" * 50, "source": "/a"}],
            f"adapters[0].name '{'a' * 50}' is not a DNS label of 49 characters at most "
            "(a-z, 0-9, '-')",
        ),
        (
            [{"name": "x", "source": "/a"}, {"name": "x", "source": "/b"}],
            "adapters[1].name 'x' is given twice",
        ),
        ([{"name": "demo", "source": "/a"}], "adapters[0].name 'demo' is the model's served name"),
        (
            [{"name": "x", "source": "s3://b/x"}],
            "adapters[0].source 's3://b/x': unknown scheme 's3' (use hf://, pvc:// or an "
            "absolute path inside the image)",
        ),
        (
            [{"name": "x", "source": "pvc://Bad/x"}],
            "adapters[0].source 'pvc://Bad/x': expected pvc://claim/path",
        ),
    ],
)
def test_invalid_adapters_are_refused_by_name(adapters: list, message: str) -> None:
    spec, _ = parse_spec(with_adapters(adapters)["spec"])
    assert adapters_problem(spec, "cpu-demo") == message


@pytest.mark.parametrize("flag", ["--lora-modules", "--no-allow-runtime-lora-updating"])
def test_extra_args_may_not_set_the_adapter_flags(flag: str) -> None:
    body = with_adapters(IMAGE_ADAPTERS[:1])
    body["spec"]["extraArgs"] = [flag]
    with pytest.raises(InvalidSpec) as refused:
        validated(body)
    assert str(refused.value) == (
        f"spec.extraArgs may not set flags the operator renders: {flag} (set by spec.adapters)"
    )


def test_the_server_accepts_the_rendered_adapter_flags() -> None:
    body = with_adapters([*IMAGE_ADAPTERS, {"name": "sql", "source": "hf://org/sql-lora"}])
    spec, _ = validated(body)
    assert [a.name for a in spec.adapters] == ["pirate", "poet", "sql"]


def test_crd_schema_takes_adapters_and_refuses_a_bad_name() -> None:
    body = with_adapters(IMAGE_ADAPTERS)
    assert list(crd_validator().iter_errors(body)) == []
    body["spec"]["adapters"][0]["name"] = "Pirate"
    assert [e.message for e in crd_validator().iter_errors(body)] == [
        "'Pirate' does not match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
    ]


def test_engine_lora_limits_render_as_the_server_flags_before_enable_lora() -> None:
    body = with_adapters(IMAGE_ADAPTERS)
    body["spec"]["engine"] |= {"maxLoras": 4, "maxLoraRank": 64, "maxCpuLoras": 8}
    assert list(crd_validator().iter_errors(body)) == []
    args = server(body)["args"]
    assert args[-7:] == [
        "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8", "--enable-lora",
    ]  # fmt: skip
    assert validated(body)[0].engine.max_loras == 4


def test_engine_lora_limits_left_unset_render_nothing() -> None:
    args = server(with_adapters(IMAGE_ADAPTERS))["args"]
    assert not {"--max-loras", "--max-lora-rank", "--max-cpu-loras"} & set(args)


def test_fewer_cpu_loras_than_device_loras_is_refused_as_the_server_refuses_it() -> None:
    body = with_adapters(IMAGE_ADAPTERS)
    body["spec"]["engine"] |= {"maxLoras": 4, "maxCpuLoras": 2}
    with pytest.raises(InvalidSpec) as refused:
        validated(body)
    assert str(refused.value) == (
        "kvserve serve would refuse to start: max_cpu_loras (2) must be >= max_loras (4)"
    )


@pytest.mark.parametrize("field", ["maxLoras", "maxLoraRank", "maxCpuLoras"])
def test_crd_schema_refuses_a_lora_limit_below_one(field: str) -> None:
    body = with_adapters(IMAGE_ADAPTERS)
    body["spec"]["engine"][field] = 0
    assert [e.message for e in crd_validator().iter_errors(body)] == [
        "0 is less than the minimum of 1"
    ]
