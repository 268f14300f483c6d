"""What the operator refuses before applying anything: names, quantities, server arguments."""

import copy
import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from k8s.support import ROOT, SAMPLES, KubeTools, load_sample, owner
from kvserve.engine.execution_plan import plan_execution
from kvserve.engine.models.model_config import ModelConfig
from kvserve.operator.children import desired_children
from kvserve.operator.deployment import serve_args
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.owned_flags import OWNED
from kvserve.operator.quantity import parse_quantity
from kvserve.operator.server_args import server_refusal
from kvserve.operator.spec import InvalidSpec, parse_spec
from kvserve.operator.status import build_status
from kvserve.operator.validation import InvalidName, validated
from kvserve.server import smollm2
from kvserve.server.cli import DEFAULT_MODEL, build_parser, engine_config
from kvserve.server.server_settings import CRD_ENGINE_SETTINGS

TP2: dict[str, Any] = {"engine": {"tensorParallelSize": 2}, "resources": {"gpus": 2}}


def _server(body: dict[str, Any]) -> dict[str, Any]:
    spec, source = validated(body)
    children = desired_children(body, spec, source, ClusterApis(), "kvserve:0.1.0", None)
    deployment = next(c for c in children if c["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _chart_default(tools: KubeTools) -> dict[str, Any]:
    chart = str(ROOT / "charts" / "llmdeployment")
    out = tools.helm_run("template", "demo", chart, "--namespace", "kvs")
    (body,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    body["metadata"].update(uid="uid-1", generation=1)
    return body


def _parse_as_the_server_would(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch):
    """``kvserve ARGS`` through the server's own CLI parser, in the container's environment."""
    for name in [n for n in os.environ if n.startswith("KVSERVE_")]:
        monkeypatch.delenv(name)
    for entry in container["env"]:
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
    assert container["command"] == ["kvserve"]
    args = build_parser().parse_args(container["args"])
    return args, engine_config(args)


@pytest.mark.parametrize("sample", [p.name for p in SAMPLES])
def test_every_sample_renders_args_the_server_accepts(
    sample: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = owner(sample)
    container = _server(body)
    args, config = _parse_as_the_server_would(container, monkeypatch)
    spec, _ = parse_spec(body["spec"])
    assert (args.command, args.port, args.host) == ("serve", 8000, "0.0.0.0")
    assert args.shutdown_timeout == spec.drain.timeout_seconds
    assert config.tensor_parallel_size == spec.engine.tensor_parallel_size
    assert server_refusal(container["args"], container["env"]) is None


IMAGE_MODELS = {
    "/opt/kvserve/models/demo": DEFAULT_MODEL,
    f"/opt/kvserve/models/{smollm2.SERVED_NAME}": smollm2.model_path().parent,
}
"""Checkpoints the serving image holds (e2e/Dockerfile puts them there), and where the same
files are on this machine (SmolLM2: the cache that ``make test`` fills)."""


@pytest.mark.parametrize(
    "sample",
    [p.name for p in SAMPLES if load_sample(p.name)["spec"]["model"]["source"] in IMAGE_MODELS],
)
def test_samples_of_an_image_model_fit_that_model(
    sample: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server decides once it has read the checkpoint (``plan_execution``) accepts
    the sample too: e.g. its ``maxModelLen`` is within the model's context."""
    body = owner(sample)
    _, config = _parse_as_the_server_would(_server(body), monkeypatch)
    local = dataclasses.replace(config, model=str(IMAGE_MODELS[config.model]))
    plan = plan_execution(local, ModelConfig.from_dir(local.model))
    spec, _ = parse_spec(body["spec"])
    assert plan.max_model_len == spec.engine.max_model_len


def test_chart_default_renders_args_the_server_accepts(
    kube_tools: KubeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = _server(_chart_default(kube_tools))
    args, config = _parse_as_the_server_would(container, monkeypatch)
    assert (args.model, args.served_model_name) == ("/models/model", "demo")
    assert (config.device, config.dtype, config.enable_prefix_caching) == ("cpu", "auto", True)


def test_tool_calls_and_kv_events_render_args_the_server_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["engine"] = {"toolCallParser": "llama3_json", "kvEvents": {"enabled": True}}
    args, config = _parse_as_the_server_would(_server(body), monkeypatch)
    assert (args.enable_auto_tool_choice, args.tool_call_parser) == (True, "llama3_json")
    events = config.kv_events_config
    assert (events.enable_kv_cache_events, events.publisher, events.endpoint, events.topic) == (
        True,
        "zmq",
        "tcp://*:5557",
        "kv@$(POD_NAME)@demo",
    )


def test_tensor_parallel_renders_args_the_server_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    body = owner("cpu-demo.yaml")
    body["spec"].update(TP2)
    validated(body)
    container = _server(body)
    _, config = _parse_as_the_server_would(container, monkeypatch)
    assert (config.tensor_parallel_size, config.distributed_executor_backend) == (2, "mp")


def test_a_setting_the_server_refuses_is_refused_as_the_server_refuses_it() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"].update(TP2)
    body["spec"]["engine"]["distributedExecutorBackend"] = "uni"
    with pytest.raises(InvalidSpec) as e:
        validated(body)
    assert (e.value.reason, str(e.value)) == (
        "InvalidSpec",
        "kvserve serve would refuse to start: distributed_executor_backend uni runs one rank, "
        "not tensor_parallel_size 2; use mp",
    )


@pytest.mark.parametrize(
    ("patch", "refusal"),
    [
        ({"extraArgs": ["--bogus"]}, "unrecognized arguments: --bogus"),
        ({"extraArgs": ["--help"]}, "unrecognized arguments: --help"),
        (
            {"extraArgs": ["--max-waiting-requests", "lots"]},
            "argument --max-waiting-requests: invalid int value: 'lots'",
        ),
        ({"extraArgs": ["--num-kv-blocks", "0"]}, "num_kv_blocks must be >= 1, got 0"),
        (
            {"engine": {"speculativeConfig": {"method": "eagle", "numSpeculativeTokens": 2}}},
            "argument --speculative-config: speculative_config.method 'eagle' is not supported "
            "(a vLLM method kvserve does not run); supported: ngram, draft_model",
        ),
        (
            {"env": [{"name": "KVSERVE_ATTENTION_BACKEND", "value": "flash"}]},
            "kvserve: KVSERVE_ATTENTION_BACKEND must be one of auto, torch, cpu, triton",
        ),
        (
            {"env": [{"name": "KVSERVE_ENFORCE_EAGER", "value": "maybe"}]},
            "kvserve: KVSERVE_ENFORCE_EAGER must be true or false, not 'maybe'",
        ),
    ],
)
def test_what_the_server_refuses_is_an_invalid_spec(patch: dict, refusal: str) -> None:
    body = owner("cpu-demo.yaml")
    body["spec"].update(patch)
    with pytest.raises(InvalidSpec) as e:
        validated(body)
    assert str(e.value) == f"kvserve serve would refuse to start: {refusal}"


@pytest.mark.parametrize(
    "extra",
    [["--port", "9000"], ["--port=9000"], ["--por=9000"], ["--po", "9000"]],
)
def test_extra_args_that_move_the_port_are_refused(extra: list[str]) -> None:
    """Every spelling the server's own parser takes as ``--port`` (argparse's ``=`` and
    abbreviations) is refused, naming the flag as the operator renders it."""
    assert build_parser().parse_args(["serve", "--port", "8000", *extra]).port == 9000
    body = owner("cpu-demo.yaml")
    body["spec"]["extraArgs"] = extra
    with pytest.raises(InvalidSpec) as e:
        validated(body)
    assert (e.value.reason, str(e.value)) == (
        "InvalidSpec",
        "spec.extraArgs may not set flags the operator renders: --port (always 8000)",
    )


def test_every_owned_flag_in_extra_args_is_named_once_with_where_it_is_set() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["extraArgs"] = [
        "--seed", "1", "--host=127.0.0.1", "--model", "/elsewhere", "--served-model-name", "x",
        "--device", "cuda", "--shutdown-timeout=9999", "--kv-events-config", "{}",
        "--api-key", "k", "--dtype", "float32", "--tensor-parallel-size", "2",
        "--no-enable-prefix-caching", "--enable-auto-tool-choice", "--max-model-len", "64",
        "--host", "::",
    ]  # fmt: skip
    with pytest.raises(InvalidSpec) as e:
        validated(body)
    assert str(e.value) == (
        "spec.extraArgs may not set flags the operator renders: --host (always 0.0.0.0), "
        "--model (set by spec.model.source), --served-model-name (set by spec.model.servedName), "
        "--device (set by spec.resources.gpus), --shutdown-timeout (set by "
        "spec.drain.timeoutSeconds), --kv-events-config (set by spec.engine.kvEvents), "
        "--api-key (set by spec.apiKeySecret), --dtype (set by spec.engine.dtype), "
        "--tensor-parallel-size (set by spec.engine.tensorParallelSize), "
        "--no-enable-prefix-caching (set by spec.engine.enablePrefixCaching), "
        "--enable-auto-tool-choice (set by spec.engine.toolCallParser), "
        "--max-model-len (set by spec.engine.maxModelLen)"
    )


def test_every_flag_the_operator_renders_is_owned() -> None:
    """A spec that sets every engine setting and KV events: each flag of its container that
    does not come from extraArgs is one extraArgs may not set."""
    body = owner("cpu-demo.yaml")
    engine = {d.crd_name: d.default for d in CRD_ENGINE_SETTINGS if d.default is not None}
    engine |= {"maxModelLen": 64, "maxNumSeqs": 4, "maxNumBatchedTokens": 64, "blockSize": 16,
               "longPrefillTokenThreshold": 32, "gpuMemoryUtilization": 0.5,
               "toolCallParser": "llama3_json", "kvEvents": {"enabled": True},
               "distributedExecutorBackend": "uni", "quantization": "fp8",
               "reasoningParser": "openai_gptoss", "maxCpuLoras": 2,
               "speculativeConfig": {"method": "ngram", "numSpeculativeTokens": 2},
               "asyncScheduling": True}  # fmt: skip
    body["spec"]["engine"] = engine
    spec, source = validated(body)
    rendered = [a for a in serve_args("cpu-demo", spec, source) if a.startswith("--")]
    assert rendered == [
        "--model", "--served-model-name", "--host", "--port", "--device", "--dtype",
        "--tensor-parallel-size", "--enable-prefix-caching", "--shutdown-timeout",
        "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
        "--long-prefill-token-threshold", "--block-size", "--gpu-memory-utilization",
        "--distributed-executor-backend", "--quantization", "--kv-cache-dtype",
        "--async-scheduling", "--max-loras", "--max-lora-rank", "--max-cpu-loras",
        "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser",
        "--kv-events-config", "--speculative-config",
    ]  # fmt: skip
    assert {d.flag for d in CRD_ENGINE_SETTINGS} <= set(rendered)
    assert [a for a in rendered if a not in OWNED] == []


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-waiting-requests", "256"],
        ["--seed=3", "--attention-backend", "torch", "--enforce-eager", "--num-kv-blocks", "64"],
        ["--timeout-keep-alive", "9", "--request-body-timeout=60", "--kv-cache-memory-gb", "1"],
    ],
)
def test_flags_the_operator_does_not_render_pass(extra: list[str]) -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["extraArgs"] = extra
    spec, source = validated(body)
    assert serve_args("cpu-demo", spec, source)[-len(extra) :] == extra


def test_env_from_a_secret_is_not_guessed() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["env"] = [
        {"name": "KVSERVE_PORT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    ]
    validated(body)


@pytest.mark.parametrize("name", ["1model", "with.dot", "Upper", "ends-", "a" * 64, "under_score"])
def test_names_that_cannot_name_a_service(name: str) -> None:
    body = owner("cpu-demo.yaml")
    body["metadata"]["name"] = name
    with pytest.raises(InvalidName) as e:
        validated(body)
    assert (e.value.reason, str(e.value)) == (
        "InvalidName",
        f"metadata.name {name!r} cannot name a Service: use a DNS-1035 label (a lowercase "
        "letter, then lowercase letters, digits or '-', not ending in '-', at most 63 "
        "characters)",
    )
    status = build_status(body, None, (e.value.reason, str(e.value)))
    assert "endpoint" not in status and status["phase"] == "Degraded"


def test_longest_service_name_is_served() -> None:
    body = owner("cpu-demo.yaml")
    body["metadata"]["name"] = "a" + "-0" * 31
    validated(body)
    assert build_status(body, None)["endpoint"] == f"http://{'a' + '-0' * 31}.ml.svc:8000/v1"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", "0.5"),
        ("16Gi", str(16 * 2**30)),
        ("1.5", "1.5"),
        ("2e3", "2000"),
        ("4k", "4000"),
        ("1E", str(10**18)),
        (".5Ki", "512"),
    ],
)
def test_quantities(text: str, value: str) -> None:
    assert parse_quantity(text) == parse_quantity(value)


@pytest.mark.parametrize("text", ["4K", "1ki", "NaN", "Infinity", "1 ", "1\n", "", "1e1000"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"memory": "99999999999Ei"}, "resources.memory '99999999999Ei' is outside 512Mi..1Pi"),
        ({"memory": "2Pi"}, "resources.memory '2Pi' is outside 512Mi..1Pi"),
        ({"memory": "64Mi"}, "resources.memory '64Mi' is outside 512Mi..1Pi"),
        ({"cpu": "2000000"}, "resources.cpu '2000000' is outside 1m..1000000"),
        ({"cpu": "0"}, "resources.cpu '0' is outside 1m..1000000"),
        ({"shmSize": "9Ei"}, "resources.shmSize '9Ei' is outside 1Mi..1Pi"),
        ({"memory": "4K"}, "resources.memory: '4K' is not a Kubernetes quantity"),
    ],
)
def test_absurd_quantities_are_invalid(resources: dict[str, str], message: str) -> None:
    raw = copy.deepcopy(owner("cpu-demo.yaml")["spec"])
    raw["resources"].update(resources)
    with pytest.raises(InvalidSpec) as e:
        parse_spec(raw)
    assert str(e.value) == message


def test_the_operator_imports_no_torch() -> None:
    """The operator's pod has 256Mi; torch alone would take more. Validating a spec with the
    server's own parser and engine settings must not load it."""
    code = (
        "import sys, kvserve.operator.handlers, kvserve.operator.validation\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout == "[]\n"
