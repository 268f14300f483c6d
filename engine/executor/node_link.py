"""The step sockets of ranks on other nodes: the leader listens, each remote rank dials it.

The leader publishes its listening address in the rendezvous store (``STEPS_KEY``); a rank on
a headless node reads it there, connects and says ``Arrived`` with its rank. From then on the
socket carries the same frames as a local worker's socket pair (``messages.py``).
"""

import socket
import time
from datetime import timedelta

import torch.distributed as dist

from kvserve.engine.executor import messages

STEPS_KEY = "kvserve/steps"


def _quick(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class NodeListener:
    """The leader's end: a listening socket whose address the store publishes."""

    def __init__(self, store: dist.Store, master_addr: str) -> None:
        self.sock = socket.create_server(("", 0))
        self.rendezvous = master_addr
        store.set(STEPS_KEY, f"{master_addr}:{self.sock.getsockname()[1]}")

    def accept(
        self, ranks: range, local: int, timeout: float, port: int
    ) -> dict[int, tuple[socket.socket, str]]:
        """Each of ``ranks``' connection and peer address, once every one said ``Arrived``
        within ``timeout``; else ``TimeoutError`` naming the nodes (``local`` ranks each)
        that never arrived."""
        arrived: dict[int, tuple[socket.socket, str]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(arrived) < len(ranks):
                self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                try:
                    conn, (address, _) = self.sock.accept()
                    conn.settimeout(max(deadline - time.monotonic(), 1e-3))
                    message = messages.receive(conn)
                except (TimeoutError, EOFError, OSError):
                    if time.monotonic() < deadline:
                        continue
                    break
                if isinstance(message, messages.Arrived) and message.rank in ranks:
                    arrived[message.rank] = (_quick(conn), address)
                else:
                    conn.close()
        finally:
            self.sock.close()
        missing = [r for r in ranks if r not in arrived]
        if missing:
            for conn, _ in arrived.values():
                conn.close()
            nodes = sorted({r // local for r in missing})
            named = ", ".join(
                f"node rank {n} (ranks {', '.join(str(r) for r in missing if r // local == n)})"
                for n in nodes
            )
            raise TimeoutError(
                f"{named} never arrived at the rendezvous at {self.rendezvous}:{port} within "
                f"{timeout:g} s (--master-addr, --master-port, --distributed-timeout-seconds)"
            )
        return arrived


def dial_leader(
    host: str, port: int, rank: int, size: int, timeout: float
) -> tuple[dist.TCPStore, socket.socket]:
    """A remote rank's store client and its step socket to the leader; ``RuntimeError``
    naming the rendezvous if the leader does not answer within ``timeout``."""
    try:
        store = dist.TCPStore(
            host, port, size, False, timeout=timedelta(seconds=timeout), wait_for_workers=False
        )
        leader, _, steps_port = store.get(STEPS_KEY).decode().rpartition(":")
        sock = socket.create_connection((leader, int(steps_port)), timeout=timeout)
    except (RuntimeError, OSError) as exc:
        raise RuntimeError(
            f"rank {rank}: the leader's rendezvous at {host}:{port} did not answer within "
            f"{timeout:g} s: {exc}"
        ) from exc
    sock.settimeout(None)
    return store, _quick(sock)
