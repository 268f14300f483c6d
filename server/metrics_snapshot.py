"""The text ``/metrics`` answers with, rebuilt off the request path."""

import contextlib
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest

# A change shows on /metrics within this plus one rebuild (~2 ms): an endpoint picker's scrape
# period (50 ms). Under load that is one rebuild per period whatever the number of scrapers
# (formatting per scrape cost one per scrape, on the event loop); idle, none.
SNAPSHOT_INTERVAL_S = 0.05
# A rebuild that an update overlapped is formatted again, this many times at most; past that
# the previous body stays (whole, only older) and the next change asks for another rebuild.
MAX_REBUILD_TRIES = 8


class ExpositionSnapshot:
    """The registry's exposition as prebuilt bytes, so a scrape only reads a reference: it
    never formats the registry, takes a metric's lock or waits on an engine step.

    Every write to the registry happens inside ``update()``, and ``body`` only ever holds an
    exposition that no update overlapped: a sequence lock. An update moves ``_seq`` before it
    writes (writers never wait on a rebuild, only on each other, for microseconds); a rebuild
    reads ``_seq`` while no update writes and keeps what it formatted only if ``_seq`` has
    not moved since. So a
    scrape never sees half of an engine step: not an abort counted without its request gone
    from ``num_requests_running``, nor the reverse.

    An update asks the snapshot's own thread for a rebuild, which comes at most once every
    ``interval`` seconds while updates keep coming, and not at all while nothing changes.
    ``rebuild()`` rebuilds at once, for rare events that must show on the next scrape.
    Rebuilds are serialized, so the newest values always land last; ``stale`` says whether
    an update came after the one ``body`` shows.
    """

    def __init__(self, registry: CollectorRegistry, interval: float = SNAPSHOT_INTERVAL_S) -> None:
        self._registry = registry
        self._interval = interval
        self._changed = threading.Event()
        self._lock = threading.Lock()  # one rebuild at a time
        self._write_lock = threading.Lock()  # one update at a time; held for microseconds
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seq = self._built = 0  # updates begun; the last one body shows
        self.body = generate_latest(registry)

    @contextlib.contextmanager
    def update(self) -> Iterator[None]:
        """Wraps one consistent set of writes to the registry (any thread)."""
        with self._write_lock:
            self._seq += 1
            yield
        self._changed.set()

    @property
    def stale(self) -> bool:
        return self._built != self._seq

    def rebuild(self) -> None:
        with self._lock:
            for _ in range(MAX_REBUILD_TRIES):
                with self._write_lock:
                    seq = self._seq  # no update is writing
                body = generate_latest(self._registry)
                if self._seq == seq:
                    self.body, self._built = body, seq
                    return

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kvserve-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stopping = True
            self._changed.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            self._changed.wait()
            if self._stopping:
                return
            self._changed.clear()
            self.rebuild()
            time.sleep(self._interval)
