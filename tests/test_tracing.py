"""Request traces from a real ``kvserve serve`` to a real OTLP receiver: vLLM's span and
attributes, the caller's ``traceparent`` continued, and nothing at all when tracing is off."""

import json
import subprocess
import sys
import time
from itertools import pairwise

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kvserve.server.cli import build_parser, main

from otlp_receiver import OTLPReceiver, attributes
from server_process import ServerProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
LATENCY_KEYS = {
    "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference",
}


@pytest.fixture
def receiver():
    with OTLPReceiver() as r:
        yield r


@pytest.fixture
def quick_export(monkeypatch):
    """The SDK's batch exporter sends every 50 ms instead of every 5 s."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


def completion(server: ServerProcess, headers: dict[str, str], **body) -> dict:
    status, _, raw = server.send(
        "/v1/completions",
        json.dumps({"model": "tiny", "prompt": "def f(x):", **body}).encode(),
        {"Content-Type": "application/json", **headers},
    )
    assert status == 200, raw
    return json.loads(raw)


def wait_for_spans(receiver: OTLPReceiver, count: int, seconds: float = 20.0) -> list[Span]:
    deadline = time.monotonic() + seconds
    while len(receiver.spans) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(receiver.spans)


def test_a_request_is_one_llm_request_span_under_the_callers_traceparent(
    checkpoint, receiver, quick_export, tmp_path
):
    args = ("--otlp-traces-endpoint", receiver.endpoint)
    with ServerProcess(checkpoint("llama"), *args, log=tmp_path / "server.log") as server:
        headers = {"traceparent": TRACEPARENT, "tracestate": "gw=1", "X-Request-Id": "trace-1"}
        body = completion(
            server, headers, max_tokens=5, n=2, temperature=0.5, top_p=0.9, ignore_eos=True
        )
        (span,) = wait_for_spans(receiver, 1)
    assert span.name == "llm_request"
    assert span.kind == Span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_ID
    assert span.trace_state == "gw=1"
    assert receiver.scopes == ["kvserve.server"]
    assert receiver.resources[0]["service.name"] == "kvserve"
    found = attributes(span)
    latencies = {key: found.pop(key) for key in LATENCY_KEYS}
    assert found == {
        "gen_ai.response.model": "tiny",
        "gen_ai.request.id": "cmpl-trace-1-0-0",
        "gen_ai.request.n": 2,
        "gen_ai.request.max_tokens": 5,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.usage.prompt_tokens": body["usage"]["prompt_tokens"],
        "gen_ai.usage.completion_tokens": 10,
        "gen_ai.response.finish_reasons": ["length", "length"],
    }
    assert body["usage"]["completion_tokens"] == 10
    queue = latencies["gen_ai.latency.time_in_queue"]
    ttft = latencies["gen_ai.latency.time_to_first_token"]
    prefill = latencies["gen_ai.latency.time_in_model_prefill"]
    decode = latencies["gen_ai.latency.time_in_model_decode"]
    assert 0 <= queue < ttft <= latencies["gen_ai.latency.e2e"]
    assert queue + prefill == pytest.approx(ttft, abs=1e-6)
    assert prefill + decode == pytest.approx(
        latencies["gen_ai.latency.time_in_model_inference"], abs=1e-6
    )
    duration = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert duration == pytest.approx(latencies["gen_ai.latency.e2e"], abs=1e-6)
    assert abs(span.start_time_unix_nano / 1e9 - time.time()) < 120  # on the wall clock


def test_detailed_traces_add_the_phases_and_a_request_without_traceparent_starts_a_trace(
    checkpoint, receiver, quick_export, tmp_path
):
    args = ("--otlp-traces-endpoint", receiver.endpoint, "--collect-detailed-traces", "all")
    with ServerProcess(checkpoint("llama"), *args, log=tmp_path / "server.log") as server:
        completion(server, {}, max_tokens=3, ignore_eos=True)
        spans = wait_for_spans(receiver, 4)
    assert len(spans) == 4
    by_name = {span.name: span for span in spans}
    root = by_name.pop("llm_request")
    assert root.parent_span_id == b""
    assert len(root.trace_id) == 16 and root.trace_id != bytes(16)
    phases = [by_name[name] for name in ("queue", "prefill", "decode")]
    assert {p.trace_id for p in phases} == {root.trace_id}
    assert {p.parent_span_id for p in phases} == {root.span_id}
    assert phases[0].start_time_unix_nano == root.start_time_unix_nano
    for before, after in pairwise(phases):
        assert before.end_time_unix_nano == after.start_time_unix_nano
    found = attributes(root)
    inference = found["gen_ai.latency.time_in_model_inference"]
    end_of_decode = phases[2].end_time_unix_nano - phases[1].start_time_unix_nano
    assert end_of_decode / 1e9 == pytest.approx(inference, abs=1e-6)
    assert found["gen_ai.request.id"].startswith("cmpl-")
    assert found["gen_ai.response.finish_reasons"] == ["length"]
    assert "gen_ai.request.temperature" not in found  # not given, not sent


def test_tracing_off_sends_nothing_even_with_the_sdks_environment_set(
    checkpoint, receiver, quick_export, monkeypatch, tmp_path
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with ServerProcess(checkpoint("llama"), log=tmp_path / "server.log") as server:
        completion(server, {"traceparent": TRACEPARENT}, max_tokens=2)
        time.sleep(0.5)  # ten export periods
    assert receiver.spans == []


def test_the_request_path_never_imports_the_sdk():
    """Everything ``kvserve serve`` imports to serve, and no OpenTelemetry module among it."""
    code = (
        "import sys\n"
        "import kvserve.server.serve, kvserve.server.cli, kvserve.server.app\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_detailed_traces_take_vllms_list_and_need_an_endpoint(capsys):
    args = build_parser().parse_args(["serve", "--collect-detailed-traces", "model,worker"])
    assert args.collect_detailed_traces == "model,worker"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--collect-detailed-traces", "model,gpu"])
    assert exit_info.value.code == 2
    assert "gpu: not one of all, model, worker" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--collect-detailed-traces", "all"])
    assert exit_info.value.code == 2
    assert "requires --otlp-traces-endpoint" in capsys.readouterr().err


def test_the_exporter_protocol_is_vllms_rule(monkeypatch):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPC
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTP

    from kvserve.server.tracing import span_exporter

    assert isinstance(span_exporter("http://127.0.0.1:4317"), GRPC)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    assert isinstance(span_exporter("http://127.0.0.1:4318/v1/traces"), HTTP)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="grpc or http/protobuf"):
        span_exporter("http://127.0.0.1:4318")
