"""Request traces over OpenTelemetry, as vLLM sends them (``--otlp-traces-endpoint``).

One ``llm_request`` span (kind SERVER, tracer ``kvserve.server``) per engine request: from its
arrival to the end of its response, a child of the W3C ``traceparent`` (and ``tracestate``)
that the HTTP request came with, so a gateway's trace goes on through the server. Its
attributes are vLLM's (``SpanAttributes`` in vLLM's ``tracing.py``), plus the semantic
conventions' ``gen_ai.response.finish_reasons``, one per sample. ``--collect-detailed-traces``
adds three child spans, ``queue``, ``prefill`` and ``decode``, over the request's phases.

Off by default and free when off: only ``serve`` imports this module (and so the SDK), and only
with an endpoint; the request path checks ``state.tracer is None`` and nothing else. Spans
leave in batches on the SDK's exporter thread (``BatchSpanProcessor``), never on the event
loop. The exporter is the SDK's OTLP one over gRPC, or over HTTP where
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (vLLM's rule); the SDK reads its other
``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_TRACES_INSECURE``, headers, timeouts) as usual.
"""

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvserve.engine.core.outputs import RequestOutput
from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.responses import Choice
from kvserve.server.streaming import Reply

SPAN_NAME = "llm_request"
TRACER_NAME = "kvserve.server"


class SpanAttributes:
    """vLLM's attribute keys (the semantic conventions' where they exist, then its own)."""

    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"


def span_exporter(endpoint: str) -> SpanExporter:
    """The SDK's OTLP exporter for ``endpoint``, over the protocol vLLM's rule picks."""
    protocol = os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )

        return HTTPSpanExporter(endpoint=endpoint)
    raise ValueError(f"{OTEL_EXPORTER_OTLP_TRACES_PROTOCOL}={protocol!r}: grpc or http/protobuf")


@dataclass(frozen=True)
class Timeline:
    """One engine request's moments in nanoseconds since the epoch (its samples together: the
    earliest first step and first token, the latest last token and end)."""

    arrival: int
    scheduled: int | None
    first_token: int | None
    last_token: int | None
    end: int

    @classmethod
    def of(cls, outputs: Sequence[RequestOutput]) -> "Timeline":
        """From the engine's monotonic times, moved onto the wall clock."""
        now_wall, now_mono = time.time_ns(), time.monotonic()

        def wall(moment: float) -> int:
            return now_wall - round((now_mono - moment) * 1e9)

        def earliest(moments: list[float | None]) -> int | None:
            known = [m for m in moments if m is not None]
            return wall(min(known)) if known else None

        def latest(moments: list[float | None]) -> int | None:
            known = [m for m in moments if m is not None]
            return wall(max(known)) if known else None

        finished = [o.finished_time for o in outputs]
        end = latest(finished) if None not in finished else None  # else cut: it ends now
        return cls(
            arrival=wall(outputs[0].arrival_time),
            scheduled=earliest([o.first_scheduled_time for o in outputs]),
            first_token=earliest([o.first_token_time for o in outputs]),
            last_token=latest([o.last_token_time for o in outputs]),
            end=now_wall if end is None else end,
        )

    def phases(self) -> list[tuple[str, int, int]]:
        """``(name, start, end)`` of each phase the request reached."""
        moments = [("queue", self.arrival), ("prefill", self.scheduled)]
        moments += [("decode", self.first_token), ("", self.last_token)]
        known = [(name, t) for name, t in moments if t is not None]
        return [(name, t, t_next) for (name, t), (_, t_next) in pairwise(known)]


def _seconds(start: int | None, end: int | None) -> float | None:
    return None if start is None or end is None else (end - start) / 1e9


class RequestTracer:
    """Sends each finished response's spans; ``shutdown`` flushes those not sent yet."""

    def __init__(self, exporter: SpanExporter, detailed: bool) -> None:
        self._provider = TracerProvider(resource=Resource({SERVICE_NAME: "kvserve"}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer: Tracer = self._provider.get_tracer(TRACER_NAME)
        self._detailed = detailed
        self._propagator = TraceContextTextMapPropagator()

    def record(self, reply: Reply) -> None:
        """One span per engine request of ``reply`` that got any output from the engine."""
        parent = self._propagator.extract(reply.request.headers)  # case-insensitive keys
        n = reply.fan.n
        for p in range(len(reply.fan.request_ids)):
            samples = reply.choices[p * n : p * n + n]
            outputs = [c.latest for c in samples if c.latest is not None]
            if outputs:
                timeline = Timeline.of(outputs)
                self._send(parent, self._attributes(reply, p, samples, timeline), timeline)

    def _attributes(
        self, reply: Reply, prompt: int, samples: list[Choice], timeline: Timeline
    ) -> dict[str, Any]:
        """vLLM's attributes of prompt ``prompt``'s engine request (those it has), and the
        finish reason of each of its ``samples`` (``abort``: cut before it finished)."""
        outputs = [c.latest for c in samples if c.latest is not None]
        reasons = [c.latest.outputs[0].finish_reason if c.latest else None for c in samples]
        body, a = reply.body, SpanAttributes
        t = timeline
        attributes = {
            a.GEN_AI_RESPONSE_MODEL: reply.state.model_name,
            a.GEN_AI_REQUEST_ID: reply.fan.request_ids[prompt],
            a.GEN_AI_REQUEST_N: reply.fan.n,
            a.GEN_AI_USAGE_PROMPT_TOKENS: reply.prompt_lens[prompt],
            a.GEN_AI_USAGE_COMPLETION_TOKENS: sum(o.outputs[0].num_output_tokens for o in outputs),
            a.GEN_AI_LATENCY_TIME_IN_QUEUE: _seconds(t.arrival, t.scheduled),
            a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: _seconds(t.arrival, t.first_token),
            a.GEN_AI_LATENCY_E2E: _seconds(t.arrival, t.end),
            a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: _seconds(t.scheduled, t.first_token),
            a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: _seconds(t.first_token, t.last_token),
            a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: _seconds(t.scheduled, t.last_token),
            a.GEN_AI_REQUEST_TEMPERATURE: body.temperature,
            a.GEN_AI_REQUEST_TOP_P: body.top_p,
            a.GEN_AI_REQUEST_MAX_TOKENS: (
                body.max_new_tokens if isinstance(body, ChatCompletionRequest) else body.max_tokens
            ),
            a.GEN_AI_RESPONSE_FINISH_REASONS: [reason or "abort" for reason in reasons],
        }
        return {key: value for key, value in attributes.items() if value is not None}

    def _send(self, parent: Context, attributes: Mapping[str, Any], timeline: Timeline) -> None:
        span = self._tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=timeline.arrival,
        )
        if self._detailed:
            inside = set_span_in_context(span)
            for name, start, end in timeline.phases():
                self._tracer.start_span(name, context=inside, start_time=start).end(end)
        span.end(timeline.end)

    def shutdown(self) -> None:
        self._provider.shutdown()
