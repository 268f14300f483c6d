"""The adapters an engine serves, by name, and those of them held in host memory."""

from collections import OrderedDict

from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.lora.peft_adapter import LoRAAdapter, LoRAAdapterError, load_peft_adapter
from kvserve.engine.models.model_config import ModelConfig


class LoRARegistry:
    """``requests``: every adapter served (name → its ``LoRARequest``); ``loaded``: at most
    ``max_cpu_loras`` of them read into host memory, least recently used first. One dropped
    from host memory is read from its path again when a request asks for it. A request keeps
    its own adapter, so removing a name never touches requests already running under it."""

    def __init__(self, model_config: ModelConfig, max_rank: int, max_cpu_loras: int) -> None:
        self.model_config, self.max_rank, self.max_cpu_loras = model_config, max_rank, max_cpu_loras
        self.requests: dict[str, LoRARequest] = {}
        self.loaded: OrderedDict[str, LoRAAdapter] = OrderedDict()

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Serve ``request``'s adapter (read and checked now); the one already served under
        that name if its path is the same; ``LoRAAdapterError`` otherwise, with nothing
        changed."""
        known = self.requests.get(request.lora_name)
        if known is not None:
            if known.lora_path != request.lora_path:
                raise LoRAAdapterError(
                    f"LoRA adapter {request.lora_name!r} is already loaded from {known.lora_path!r}"
                )
            return self.get(request.lora_name)
        adapter = self._read(request)
        self.requests[request.lora_name] = request
        self._keep(adapter)
        return adapter

    def remove(self, name: str) -> None:
        """Stop serving ``name`` (KeyError if it is not served)."""
        del self.requests[name]
        self.loaded.pop(name, None)

    def get(self, name: str) -> LoRAAdapter:
        """The adapter served as ``name`` (KeyError if none), read again if it was dropped."""
        request = self.requests[name]
        adapter = self.loaded.get(name)
        if adapter is None:
            adapter = self._read(request)
        self._keep(adapter)
        return adapter

    def _read(self, request: LoRARequest) -> LoRAAdapter:
        return load_peft_adapter(request, self.model_config, self.max_rank)

    def _keep(self, adapter: LoRAAdapter) -> None:
        self.loaded[adapter.name] = adapter
        self.loaded.move_to_end(adapter.name)
        while len(self.loaded) > self.max_cpu_loras:
            self.loaded.popitem(last=False)
