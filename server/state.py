"""What the server holds for its whole life: the engine, the metrics, the drain, the
admission and the settings, and the key of each HTTP request's id."""

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from kvserve.engine.async_llm import AsyncLLM
from kvserve.server.admission import Admission
from kvserve.server.drain import DrainState
from kvserve.server.metrics import ServerMetrics
from kvserve.server.served_loras import ServedLoRAs

if TYPE_CHECKING:  # the tracer's module imports the OpenTelemetry SDK: only serve loads it
    from kvserve.server.tracing import RequestTracer

REQUEST_ID = web.RequestKey("request_id", str)
"""The request's id: the client's X-Request-Id, or a fresh one (set by the app's middleware)."""


@dataclass
class ServerState:
    llm: AsyncLLM
    model_name: str
    model_path: str
    metrics: ServerMetrics
    drain: DrainState
    api_key: str | None = None
    max_waiting_requests: int | None = None
    body_timeout: float = 30.0  # seconds a request body may take to arrive
    auto_tool_parser: str | None = None  # for tool_choice "auto": --tool-call-parser, if enabled
    reasoning_parser: str | None = None  # --reasoning-parser
    tracer: "RequestTracer | None" = None  # with --otlp-traces-endpoint only
    allow_runtime_lora_updating: bool = False  # routes /v1/load_lora_adapter and unload
    loras: ServedLoRAs = field(default_factory=ServedLoRAs)
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: itertools.count = field(default_factory=itertools.count)
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.max_waiting_requests, self.llm.max_num_seqs)

    def engine_request_id(self, api_id: str, choice: int) -> str:
        return f"{api_id}-{next(self._ids)}-{choice}"
