"""How long each phase of building an engine took (``kvserve:startup_phase_seconds``)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch


@dataclass
class StartupPhases:
    """Seconds spent in each phase of ``LLMEngine(config)``, in the order they run.

    - ``download``: fetching the model. Always 0: ``kvserve serve`` reads a local directory
      and never downloads (for an ``hf://`` source the operator's init container fetches the
      model before the server process starts).
    - ``load``: the model's config and tokenizer, then its weights read and copied onto the
      device.
    - ``kv_alloc``: sizing the KV cache (on CUDA, a profiling forward pass), allocating its
      tensors and the block pool.
    - ``warmup``: capturing the decode CUDA graphs (CUDA only), then one forward pass of one
      token through the whole step path, so that the first request pays no first-call cost.
    """

    download: float = 0.0
    load: float = 0.0
    kv_alloc: float = 0.0
    warmup: float = 0.0

    @contextmanager
    def measure(self, phase: str, device: torch.device | None = None) -> Iterator[None]:
        """Add the time of the ``with`` body to ``phase`` (on CUDA, once ``device`` is idle)."""
        start = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        setattr(self, phase, getattr(self, phase) + time.perf_counter() - start)

    def items(self) -> list[tuple[str, float]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.items())
