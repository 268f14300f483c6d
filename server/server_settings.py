"""The ``kvserve serve`` settings that are not the engine's, declared as ``EngineConfig``'s are
(see ``engine/settings.py``); ``server/serve.py`` reads them from the parsed flags."""

from dataclasses import dataclass

from kvserve.engine.config import EngineConfig
from kvserve.engine.settings import Crd, Declared, declared, setting
from kvserve.server.lora_modules import LoRAModule, parse_lora_module
from kvserve.server.reasoning_parsers import REASONING_PARSERS
from kvserve.server.tool_parsers import TOOL_PARSERS

DETAILED_TRACES = ("all", "model", "worker")
"""vLLM's values of ``--collect-detailed-traces``; kvserve has one level of detail (the phase
spans of ``server/tracing.py``), which each of them turns on."""


def detailed_traces(text: str) -> str:
    """``--collect-detailed-traces`` as vLLM takes it: a comma-separated list of its values."""
    unknown = [part for part in text.split(",") if part not in DETAILED_TRACES]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not one of {', '.join(DETAILED_TRACES)}")
    return text


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str | None = setting(None, help="name clients use (default: --model)")
    host: str = setting("0.0.0.0")
    port: int = setting(8000)
    api_key: str | None = setting(None, help="require 'Authorization: Bearer KEY' on the API")
    max_waiting_requests: int | None = setting(None, help="queue limit; beyond it, 503")
    shutdown_timeout: float = setting(30.0, help="drain limit after SIGTERM (s)")
    timeout_keep_alive: float = setting(
        5.0, help="seconds a connection may sit idle or take to send its request headers"
    )
    request_body_timeout: float = setting(
        30.0, help="seconds a request body may take to arrive; beyond it, 408"
    )
    enable_auto_tool_choice: bool = setting(
        False,
        help="parse tool calls out of the output for tool_choice 'auto' (needs --tool-call-parser)",
    )
    tool_call_parser: str | None = setting(
        None,
        choices=tuple(sorted(TOOL_PARSERS)),
        help="tool-call format",
        crd=Crd(with_flags=("--enable-auto-tool-choice",)),
    )
    reasoning_parser: str | None = setting(
        None,
        choices=tuple(sorted(REASONING_PARSERS)),
        help="reasoning format: chat replies carry the reasoning as reasoning_content",
        crd=Crd(),
    )
    otlp_traces_endpoint: str | None = setting(
        None,
        help="send one OpenTelemetry span per request to this OTLP collector (gRPC, or HTTP "
        "with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); unset: no tracing",
    )
    lora_modules: list[LoRAModule] | None = setting(
        None,
        parse=parse_lora_module,
        nargs="+",
        metavar="NAME=PATH",
        help="LoRA adapters served from start-up (needs --enable-lora): name=path, or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'',
    )
    allow_runtime_lora_updating: bool = setting(
        False,
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING)",
    )
    collect_detailed_traces: str | None = setting(
        None,
        parse=detailed_traces,
        metavar="{all,model,worker}[,...]",
        help="add each traced request's queue, prefill and decode spans "
        "(needs --otlp-traces-endpoint)",
    )


SERVE_SETTINGS: list[Declared] = declared(EngineConfig) + declared(ServerSettings)
"""Every ``serve`` flag, the engine's first."""

CRD_ENGINE_SETTINGS: list[Declared] = [d for d in SERVE_SETTINGS if d.setting.crd is not None]
"""The CRD ``engine`` block's fields the operator renders as flags (its ``kvEvents`` aside)."""
