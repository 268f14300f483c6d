"""The text ``/metrics`` answers with, rebuilt off the request path."""

import threading
import time

from prometheus_client import CollectorRegistry, generate_latest

# A change shows on /metrics within this plus one rebuild (~2 ms): an endpoint picker's scrape
# period (50 ms). Under load that is one rebuild per period whatever the number of scrapers
# (formatting per scrape cost one per scrape, on the event loop); idle, none.
SNAPSHOT_INTERVAL_S = 0.05


class ExpositionSnapshot:
    """The registry's exposition as prebuilt bytes, so a scrape only reads a reference: it
    never formats the registry, takes a metric's lock or waits on an engine step.

    ``changed()`` (cheap, any thread) asks for a rebuild; the snapshot's own thread rebuilds
    at most once every ``interval`` seconds while changes keep coming, and not at all while
    nothing changes. ``rebuild()`` rebuilds at once, for rare events that must show on the
    next scrape. Rebuilds are serialized, so the newest values always land last; ``stale``
    says whether a change came after the start of the rebuild that made ``body``.
    """

    def __init__(self, registry: CollectorRegistry, interval: float = SNAPSHOT_INTERVAL_S) -> None:
        self._registry = registry
        self._interval = interval
        self._changed = threading.Event()
        self._lock = threading.Lock()  # one rebuild at a time
        self._version_lock = threading.Lock()  # never held for long: changed() cannot wait
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._version = self._built = 0
        self.body = generate_latest(registry)

    def changed(self) -> None:
        with self._version_lock:
            self._version += 1
        self._changed.set()

    @property
    def stale(self) -> bool:
        return self._built != self._version

    def rebuild(self) -> None:
        with self._lock:
            version = self._version
            self.body = generate_latest(self._registry)
            self._built = version

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
