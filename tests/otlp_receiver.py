"""An OTLP trace receiver on a loopback port (gRPC, the collector's own service definition)
that keeps every span it is sent, for the tracing tests."""

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value(v: AnyValue):
    """An attribute's value as Python: str, int, float, bool, or a list of them."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in v.array_value.values]
    return getattr(v, kind)


def attributes(span: Span) -> dict:
    return {a.key: value(a.value) for a in span.attributes}


class OTLPReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """``with OTLPReceiver() as receiver:`` → ``receiver.endpoint``, ``receiver.spans``."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.scopes: list[str] = []  # each span's instrumentation scope, in the same order
        self.resources: list[dict] = []  # each span's resource attributes
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"

    def Export(self, request, context):  # the collector service's method name
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(span)
                        self.scopes.append(scope_spans.scope.name)
                        self.resources.append(resource)
        return trace_service_pb2.ExportTraceServiceResponse()

    def __enter__(self) -> "OTLPReceiver":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)
