"""The CRD is a valid apiextensions/v1 object and its samples pass its own schema."""

import copy
import dataclasses

import jsonschema
import kubernetes_validate
import pytest

from k8s.support import (
    K8S_SCHEMA_VERSION,
    SAMPLES,
    crd_schema,
    crd_validator,
    load_crd,
    load_sample,
)
from kvserve.engine.settings import Declared
from kvserve.engine.spec_decode.config import SpeculativeConfig
from kvserve.server.server_settings import CRD_ENGINE_SETTINGS

JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def test_crd_valid_for_current_kubernetes() -> None:
    kubernetes_validate.validate(load_crd(), K8S_SCHEMA_VERSION, strict=True)


def test_crd_names_columns_and_subresources() -> None:
    crd = load_crd()
    assert crd["spec"]["names"]["shortNames"] == ["llmd"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Model",
        "Replicas",
        "Ready",
        "Phase",
        "Age",
    ]


@pytest.mark.parametrize("sample", [p.name for p in SAMPLES])
def test_samples_match_the_crd_schema(sample: str) -> None:
    crd_validator().validate(load_sample(sample))


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("spec", "replicas"), -1, "-1 is less than the minimum of 0"),
        (("spec", "engine", "dtype"), "int8", "'int8' is not one of"),
        (
            ("spec", "autoscaling", "targetKVCacheUsage"),
            1.5,
            "1.5 is greater than the maximum of 1",
        ),
        (("spec", "resources", "memory"), "lots", "'lots' does not match"),
        (("spec", "resources", "memory"), "4K", "'4K' does not match"),
        (("spec", "resources", "shmSize"), "1K", "'1K' does not match"),
        (("spec", "model"), {"revision": "main"}, "'source' is a required property"),
    ],
)
def test_schema_rejects(path: tuple[str, ...], value: object, error: str) -> None:
    body = copy.deepcopy(load_sample("hf-gpu-autoscaled.yaml"))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError) as e:
        crd_validator().validate(body)
    assert e.value.message.startswith(error)


def _declared_schema(d: Declared) -> dict[str, object]:
    """The CRD property a declared setting implies (descriptions aside)."""
    spelling, crd = d.setting, d.setting.crd
    assert crd is not None
    schema: dict[str, object] = {"type": JSON_TYPES[d.kind]}
    if spelling.choices:
        schema["enum"] = list(spelling.choices)
    if spelling.minimum is not None:
        schema["minimum"] = spelling.minimum
    if crd.defaulted:
        schema["default"] = d.default
    return {**schema, **crd.schema}


def test_crd_engine_block_is_the_settings_declaration() -> None:
    """Names, types, enums, bounds and defaults of ``spec.engine``: a setting declared with a
    ``Crd`` and missing here (or here and not declared) fails this test; ``kvEvents`` and
    ``pipelineParallelSize`` are the operator's own, ``speculativeConfig`` is
    ``SpeculativeConfig``'s (below)."""
    engine = crd_schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    in_crd = {
        name: {key: value for key, value in prop.items() if key != "description"}
        for name, prop in engine.items()
        if name not in ("kvEvents", "pipelineParallelSize", "speculativeConfig")
    }
    assert in_crd == {d.crd_name: _declared_schema(d) for d in CRD_ENGINE_SETTINGS}


def test_crd_speculative_config_is_the_configs_fields() -> None:
    """``engine.speculativeConfig``: ``SpeculativeConfig``'s fields in camelCase, the required
    ones required, the counts at least 1."""
    engine = crd_schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    spec = engine["speculativeConfig"]
    assert spec["required"] == ["method", "numSpeculativeTokens"]
    assert spec["properties"] == {
        "method": {"type": "string"},
        "numSpeculativeTokens": {"type": "integer", "minimum": 1},
        "promptLookupMin": {"type": "integer", "minimum": 1},
        "promptLookupMax": {"type": "integer", "minimum": 1},
        "model": {"type": "string"},
    }
    camel = [
        f.name.split("_")[0] + "".join(w.capitalize() for w in f.name.split("_")[1:])
        for f in dataclasses.fields(SpeculativeConfig)
    ]
    assert list(spec["properties"]) == camel
