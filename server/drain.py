"""Readiness and the drain that follows SIGTERM.

Each API request is tracked from admission to its last byte. Once draining starts,
``/ready`` answers 503 and new API requests are refused with 503, while the tracked
ones run to completion; ``wait_idle`` returns when none is left or the timeout passed.
"""

import asyncio
import contextlib
from collections.abc import Iterator


class DrainState:
    def __init__(self) -> None:
        self.loaded = False
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def ready(self) -> bool:
        return self.loaded and not self.draining

    def start_draining(self) -> None:
        self.draining = True

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True if every tracked request ended within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
