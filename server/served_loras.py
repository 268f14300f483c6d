"""The LoRA adapters the server serves: their ``LoRARequest`` (with the id the server gave
it) and the parent model ``/v1/models`` shows for each."""

import itertools
from dataclasses import dataclass, field

from kvserve.engine.lora.lora_request import LoRARequest


@dataclass(frozen=True)
class ServedLoRA:
    request: LoRARequest
    parent: str


@dataclass
class ServedLoRAs:
    """By name; ids are given in load order from 1 (vLLM's ``lora_int_id``)."""

    by_name: dict[str, ServedLoRA] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def new_request(self, name: str, path: str) -> LoRARequest:
        return LoRARequest(name, next(self._ids), path)

    def add(self, request: LoRARequest, parent: str) -> None:
        self.by_name[request.lora_name] = ServedLoRA(request, parent)

    def remove(self, name: str) -> None:
        del self.by_name[name]

    def get(self, name: str) -> LoRARequest | None:
        served = self.by_name.get(name)
        return None if served is None else served.request
