"""What rank 0 and a worker say to each other over their socket: small named types, each
pickled into one length-prefixed frame.

Rank 0 → worker: a step's ``StepInputs``, then at the end ``Shutdown``. Worker → rank 0:
``Arrived`` (started, about to join the process group), ``Ready`` (model loaded and warmed
up), ``Failed`` (it raised; it exits right after). Nothing per step comes back: a worker's
logits are discarded, and a worker that fails breaks the step's collectives on rank 0.
"""

import pickle
import socket
import struct
from dataclasses import dataclass

_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class Arrived:
    rank: int


@dataclass(frozen=True)
class Ready:
    rank: int


@dataclass(frozen=True)
class Failed:
    rank: int
    error: str
    """The worker's traceback."""


@dataclass(frozen=True)
class Shutdown:
    """Leave the step loop and exit."""


def frame(message: object) -> bytes:
    """``message`` as one frame (pickle it once, send it to every worker)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def send(sock: socket.socket, message: object) -> None:
    sock.sendall(frame(message))


def receive(sock: socket.socket) -> object:
    """The next message; ``EOFError`` once the other end closed."""
    (length,) = _LENGTH.unpack(_read(sock, _LENGTH.size))
    return pickle.loads(_read(sock, length))


def _read(sock: socket.socket, length: int) -> bytearray:
    buffer = bytearray(length)
    view, done = memoryview(buffer), 0
    while done < length:
        got = sock.recv_into(view[done:])
        if got == 0:
            raise EOFError("the other end closed the socket")
        done += got
    return buffer
