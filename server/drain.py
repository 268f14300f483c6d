"""Readiness and the drain that follows SIGTERM.

Each API request is tracked from admission to its last byte. Once draining starts,
``/ready`` answers 503 and new API requests are refused with 503, while the tracked
ones run to completion; ``wait_idle`` returns when none is left or the timeout passed.
At the deadline ``cut`` ends the engine outputs that every response still reads
(``until_cut``), so that each ends at once, a stream with a last event and ``[DONE]``.
"""

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TypeVar

T = TypeVar("T")


class DrainState:
    def __init__(self) -> None:
        self.loaded = False
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._cut = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self.loaded and not self.draining

    def start_draining(self) -> None:
        self.draining = True

    def cut(self) -> None:
        """The drain deadline: every ``until_cut`` iteration stops now."""
        self._cut.set()

    async def until_cut(self, items: AsyncGenerator[T, None]) -> AsyncIterator[T]:
        """``items`` until they end or ``cut`` is called; then ``items`` is closed (an
        engine stream closed early aborts its request)."""
        cut = asyncio.ensure_future(self._cut.wait())
        step: asyncio.Future | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(items))
                await asyncio.wait((step, cut), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            cut.cancel()
            if step is not None and not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            await items.aclose()

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
