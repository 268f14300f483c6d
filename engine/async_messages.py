"""What crosses between the event loop and ``AsyncLLM``'s engine thread: the commands the
loop sends (one small type each, applied in order) and the observer the thread tells."""

import asyncio
from dataclasses import dataclass
from typing import Protocol

from kvserve.engine.core.outputs import RequestOutput
from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.sampling_params import SamplingParams


class StepObserver(Protocol):
    """Told about every step (from the engine thread) and every abort."""

    def on_step(self, stats, outputs: list[RequestOutput]) -> None: ...

    def on_abort(self, request_id: str, stats, num_aborted: int) -> None: ...

    def on_engine_dead(self, stats, num_failed: int) -> None: ...


@dataclass(frozen=True)
class AddRequest:
    """Queue a request; ``accepted`` settles (on the event loop) once the engine took or
    refused it, and its outputs go to ``stream``."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival_time: float | None
    stream: asyncio.Queue
    accepted: asyncio.Future
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class AddLoRA:
    """Serve an adapter; ``done`` settles once it is loaded or refused (its error)."""

    lora_request: LoRARequest
    done: asyncio.Future


@dataclass(frozen=True)
class RemoveLoRA:
    """Stop serving adapter ``lora_name``; ``done`` settles (KeyError if it is not served)."""

    lora_name: str
    done: asyncio.Future


@dataclass(frozen=True)
class AbortRequest:
    """Drop a request if the engine still has it (an unknown or finished id: nothing)."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """Stop the engine thread: open requests and adds queued after it get an error."""


EngineCommand = AddRequest | AbortRequest | AddLoRA | RemoveLoRA | Shutdown
