"""The spec checks the CRD schema cannot make, and the defaults both sides share."""

from typing import Any

import pytest
from pydantic import BaseModel

from k8s.support import crd_schema, load_sample
from kvserve.operator.spec import (
    InvalidSpec,
    LLMDeploymentSpec,
    ModelSource,
    parse_model_source,
    parse_spec,
)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("hf://Qwen/Qwen2.5-0.5B-Instruct", ModelSource("hf", "Qwen/Qwen2.5-0.5B-Instruct")),
        ("hf://gpt2", ModelSource("hf", "gpt2")),
        ("pvc://models/llama/8b", ModelSource("pvc", "models", "llama/8b")),
        ("pvc://models", ModelSource("pvc", "models", "")),
        ("/opt/kvserve/models/demo", ModelSource("image", "/opt/kvserve/models/demo")),
    ],
)
def test_model_sources(source: str, expected: ModelSource) -> None:
    assert parse_model_source(source) == expected


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "s3://bucket/model",
            "model.source 's3://bucket/model': unknown scheme 's3' (use hf://, pvc:// "
            "or an absolute path inside the image)",
        ),
        ("hf://org/name/extra", "model.source 'hf://org/name/extra': expected hf://org/name"),
        ("hf://../x", "model.source 'hf://../x': expected hf://org/name"),
        ("pvc://Bad_Claim/x", "model.source 'pvc://Bad_Claim/x': expected pvc://claim/path"),
        ("pvc://claim/../etc", "model.source 'pvc://claim/../etc': expected pvc://claim/path"),
        (
            "models/qwen",
            "model.source 'models/qwen' is neither hf://org/name, pvc://claim/path "
            "nor an absolute path inside the image",
        ),
    ],
)
def test_bad_model_sources(source: str, message: str) -> None:
    with pytest.raises(InvalidSpec) as e:
        parse_model_source(source)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"model": {"source": "/m"}, "autoscaling": {"minReplicas": 5, "maxReplicas": 2,
                                                        "targetWaitingRequests": 3}},
            "autoscaling.minReplicas (5) is greater than autoscaling.maxReplicas (2)",
        ),
        (
            {"model": {"source": "/m"}, "autoscaling": {"maxReplicas": 2}},
            "autoscaling needs targetWaitingRequests and/or targetKVCacheUsage",
        ),
        (
            {"model": {"source": "/m"}, "engine": {"tensorParallelSize": 3},
             "resources": {"gpus": 2}},
            "engine.tensorParallelSize 3 × engine.pipelineParallelSize 1 = 3 ranks cannot be "
            "spread evenly over pods of resources.gpus 2 ranks each: resources.gpus 2 must "
            "divide 3",
        ),
        (
            {"model": {"source": "/m"}, "resources": {"gpus": 2}},
            "engine.tensorParallelSize 1 × engine.pipelineParallelSize 1 = 1 ranks cannot be "
            "spread evenly over pods of resources.gpus 2 ranks each: resources.gpus 2 must "
            "divide 1",
        ),
        (
            {"model": {"source": "/m"}, "engine": {"tensorParallelSize": 4,
             "pipelineParallelSize": 2}, "resources": {"ranksPerPod": 3}},
            "engine.tensorParallelSize 4 × engine.pipelineParallelSize 2 = 8 ranks cannot be "
            "spread evenly over pods of resources.ranksPerPod 3 ranks each: "
            "resources.ranksPerPod 3 must divide 8",
        ),
        (
            {"model": {"source": "/m"}, "engine": {"tensorParallelSize": 4},
             "resources": {"gpus": 2, "ranksPerPod": 1}},
            "resources.ranksPerPod 1 and resources.gpus 2 disagree: a pod runs one rank per GPU",
        ),
        (
            {"model": {"source": "/m"}, "engine": {"pipelineParallelSize": 0}},
            "spec.engine.pipelineParallelSize: Input should be greater than or equal to 1",
        ),
        ({"replicas": 1}, "spec.model: Field required"),
        (
            {"model": {"source": "/m"}, "engine": {"kvEvents": {"enabled": True, "port": 8000}}},
            "engine.kvEvents.port 8000 is the server's HTTP port",
        ),
        (
            {"model": {"source": "/m"}, "resources": {"gpus": 1, "gpuProduct": "g" * 64}},
            f"resources.gpuProduct {'g' * 64!r} cannot be a label value: use at most 63 "
            "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit",
        ),
        (
            {"model": {"source": "/m"}, "resources": {"gpuProduct": "Tesla T4"}},
            "resources.gpuProduct 'Tesla T4' cannot be a label value: use at most 63 "
            "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit",
        ),
        (
            {"model": {"source": "/m"}, "resources": {"nodeSelector": {"pool": "a", "zone": "-x"}}},
            "resources.nodeSelector['zone'] '-x' cannot be a label value: use at most 63 "
            "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit",
        ),
        (
            {"model": {"source": "/m"}, "gateway": {"inferencePool": {
                "endpointPickerRef": {"name": "e" * 64, "port": 9002}}}},
            f"gateway.inferencePool.endpointPickerRef.name {'e' * 64!r} cannot name a Service: "
            "use a DNS-1035 label (a lowercase letter, then lowercase letters, digits or '-', "
            "not ending in '-', at most 63 characters)",
        ),
        (
            {"model": {"source": "/m"}, "gateway": {"inferencePool": {
                "endpointPickerRef": {"name": "picker.ns", "port": 9002}}}},
            "gateway.inferencePool.endpointPickerRef.name 'picker.ns' cannot name a Service: "
            "use a DNS-1035 label (a lowercase letter, then lowercase letters, digits or '-', "
            "not ending in '-', at most 63 characters)",
        ),
    ],
)  # fmt: skip
def test_invalid_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec) as e:
        parse_spec(spec)
    assert str(e.value) == message


def test_longest_label_values_and_picker_name_are_accepted() -> None:
    spec, _ = parse_spec(
        {
            "model": {"source": "/m"},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-" + "A" * 56,
                          "nodeSelector": {"empty": "", "zone": "z_1.a-" + "b" * 57}},
            "gateway": {"inferencePool": {"endpointPickerRef": {"name": "e" + "-0" * 31,
                                                                "port": 9002}}},
        }
    )  # fmt: skip
    assert spec.resources.gpu_product == "NVIDIA-" + "A" * 56


def test_external_autoscaler_needs_no_target() -> None:
    spec, _ = parse_spec(
        {"model": {"source": "/m"}, "autoscaling": {"maxReplicas": 3, "controller": "External"}}
    )
    assert spec.autoscaling is not None and spec.autoscaling.controller == "External"


def test_sample_parses_to_its_fields() -> None:
    spec, source = parse_spec(load_sample("hf-gpu-autoscaled.yaml")["spec"])
    assert source == ModelSource("hf", "Qwen/Qwen2.5-0.5B-Instruct")
    assert spec.autoscaling is not None
    assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (1, 4)
    assert spec.autoscaling.target_kv_cache_usage == 0.8
    assert spec.engine.max_num_batched_tokens == 4096
    assert spec.engine.long_prefill_token_threshold == 512
    assert spec.drain.timeout_seconds == 120


def _defaults(model: type[BaseModel], schema: dict[str, Any], path: str) -> list[tuple]:
    """(path, CRD default, pydantic default) for every property that has a CRD default."""
    pairs = []
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    for prop, sub in schema.get("properties", {}).items():
        field = fields[prop]
        if "default" in sub and sub["default"] != {}:
            pairs.append((f"{path}.{prop}", sub["default"], field.get_default()))
        inner = field.annotation
        args = getattr(inner, "__args__", ())
        nested = next(
            (a for a in (inner, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
        if nested is not None and sub.get("type") == "object":
            pairs += _defaults(nested, sub, f"{path}.{prop}")
    return pairs


def test_crd_defaults_equal_the_operators() -> None:
    pairs = _defaults(LLMDeploymentSpec, crd_schema()["properties"]["spec"], "spec")
    assert {p for p, _, _ in pairs} == {
        "spec.model.hubTokenSecret.key",
        "spec.replicas",
        "spec.autoscaling.minReplicas",
        "spec.autoscaling.scaleDownStabilizationSeconds",
        "spec.autoscaling.controller",
        "spec.apiKeySecret.key",
        "spec.resources.gpus",
        "spec.resources.gpuResource",
        "spec.engine.dtype",
        "spec.engine.enablePrefixCaching",
        "spec.engine.tensorParallelSize",
        "spec.engine.pipelineParallelSize",
        "spec.engine.kvEvents.enabled",
        "spec.engine.kvEvents.port",
        "spec.drain.timeoutSeconds",
        "spec.gateway.inferencePool.endpointPickerRef.failureMode",
    }
    assert [(p, crd) for p, crd, _ in pairs] == [(p, ours) for p, _, ours in pairs]
