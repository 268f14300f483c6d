"""The ZMQ publisher of KV-cache events, off the engine's step loop.

Frames of each message on the PUB socket, as vLLM's ``ZmqEventPublisher`` sends them::

    [topic (utf-8), seq (8 bytes, big-endian), payload (``kv_events.encode_batch``)]

``seq`` numbers the batches from 0, one per engine step that changed the prefix cache. It is
taken when the engine hands a batch over, so a batch that is dropped leaves a gap a
subscriber can see. The endpoint is bound when it has a wildcard (``*`` or ``::``) or is
``ipc://`` or ``inproc://``, and connected to otherwise (vLLM's rule: the llm-d router binds
``tcp://*:5557`` and every pod connects to it). The optional replay endpoint is a bound
ROUTER: a request ``[seq]`` (8 bytes) is answered with one ``[seq, payload]`` per buffered
batch from ``seq`` on (the last ``buffer_steps``), then ``[-1 (signed, 8 bytes), b""]``.
"""

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from kvserve.engine.kv_events import KVEvent, KVEventsConfig, encode_batch

log = logging.getLogger(__name__)
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
POLL_SECONDS = 0.05
RETRY_SECONDS = 2.0
CLOSE_SECONDS = 2.0


@dataclass
class PublisherStats:
    num_published: int = 0  # batches sent on the PUB socket
    num_dropped: int = 0  # batches lost: the queue was full, or no socket to send on
    num_errors: int = 0  # socket errors: opening, sending or replaying


class ZmqEventPublisher:
    """``publish`` hands a step's events to a sender thread that owns the sockets; it never
    blocks and never raises. A full queue (``max_queue_size`` batches) drops the batch; a
    socket that cannot open is retried every RETRY_SECONDS while batches are dropped; a
    send that fails is logged and counted. Nothing here can stop the engine."""

    def __init__(self, config: KVEventsConfig, medium: str) -> None:
        self.config = config
        self.medium = medium
        self.stats = PublisherStats()
        self.num_batches = 0  # sequence numbers handed out so far
        self._topic = config.topic.encode("utf-8")
        self._queue: queue.Queue[tuple[int, float, list[KVEvent]]] = queue.Queue(
            config.max_queue_size
        )
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="kvserve-kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVEvent]) -> None:
        """Queue one batch (called from the engine thread only)."""
        seq = self.num_batches
        self.num_batches += 1
        try:
            self._queue.put_nowait((seq, time.time(), events))
        except queue.Full:
            self._drop(seq, "the queue is full")

    def close(self) -> None:
        """Send what is queued (for at most CLOSE_SECONDS), then close the sockets."""
        self._closing.set()
        self._thread.join(CLOSE_SECONDS)

    def _count_error(self) -> None:
        with self._lock:
            self.stats.num_errors += 1

    def _drop(self, seq: int, why: str) -> None:
        with self._lock:  # the engine thread and the sender thread both drop
            self.stats.num_dropped += 1
        level = logging.WARNING if self.stats.num_dropped == 1 else logging.DEBUG
        log.log(
            level, "KV-event batch %d dropped: %s (%d so far)", seq, why, self.stats.num_dropped
        )

    def _run(self) -> None:
        context = zmq.Context()
        sockets: dict[str, zmq.Socket | None] = {"pub": None, "replay": None}
        retry_at = 0.0
        try:
            while not (self._closing.is_set() and self._queue.empty()):
                if time.monotonic() >= retry_at and not self._open(context, sockets):
                    retry_at = time.monotonic() + RETRY_SECONDS
                if sockets["replay"] is not None:
                    self._serve_replay(sockets["replay"])
                try:
                    seq, ts, events = self._queue.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                self._send(sockets["pub"], seq, encode_batch(ts, events, self.medium))
        except Exception:
            self._count_error()
            log.exception("the KV-event publisher stopped; events are no longer sent")
        finally:
            for socket in sockets.values():
                if socket is not None:
                    socket.close(linger=int(CLOSE_SECONDS * 1000))
            context.term()

    def _open(self, context: zmq.Context, sockets: dict[str, zmq.Socket | None]) -> bool:
        """Open the sockets not open yet; False when one of them failed (logged, counted)."""
        wanted = {"pub": self.config.endpoint, "replay": self.config.replay_endpoint}
        ok = True
        for name, endpoint in wanted.items():
            if endpoint is None or sockets[name] is not None:
                continue
            socket = None
            try:
                socket = context.socket(zmq.PUB if name == "pub" else zmq.ROUTER)
                if name == "pub":
                    socket.set_hwm(self.config.hwm)
                if name == "replay" or _binds(endpoint):
                    socket.bind(endpoint)
                else:
                    socket.connect(endpoint)
            except zmq.ZMQError as exc:
                if socket is not None:
                    socket.close(linger=0)
                self._count_error()
                ok = False
                level = logging.ERROR if self.stats.num_errors == 1 else logging.DEBUG
                log.log(level, "KV events: cannot open %s on %s: %s", name, endpoint, exc)
                continue
            sockets[name] = socket
            log.info("KV events: %s socket on %s, topic %r", name, endpoint, self.config.topic)
        return ok

    def _send(self, pub: zmq.Socket | None, seq: int, payload: bytes) -> None:
        self._buffer.append((seq, payload))
        if pub is None:
            self._drop(seq, "the PUB socket is not open")
            return
        try:
            pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._count_error()
            self._drop(seq, f"send failed: {exc}")
            return
        self.stats.num_published += 1

    def _serve_replay(self, replay: zmq.Socket) -> None:
        """Answer every waiting replay request (malformed ones are logged and skipped)."""
        try:
            while replay.poll(0):
                frames = replay.recv_multipart()
                if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                    log.warning("KV events: malformed replay request of %d frames", len(frames))
                    continue
                client, start = frames[0], int.from_bytes(frames[2], "big")
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
                replay.send_multipart([client, b"", END_OF_REPLAY, b""])
        except zmq.ZMQError as exc:
            self._count_error()
            log.warning("KV events: replay failed: %s", exc)


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
