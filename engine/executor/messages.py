"""What rank 0 and a worker say to each other over their socket: small named types, each
pickled into one length-prefixed frame.

Rank 0 → worker: each step's ``Step``, then at the end ``Shutdown``. Worker → rank 0:
``Arrived`` (started, about to join the process group), ``Ready`` (model loaded and warmed
up), ``Failed`` (it raised; it exits right after). Nothing per step comes back: a worker's
logits are discarded, and a worker that fails breaks the step's collectives on rank 0.
"""

import dataclasses
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

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


@dataclass(frozen=True)
class Step:
    """A step's ``StepInputs`` with every tensor as a host numpy array: a numpy array pickles
    as its raw bytes, a torch tensor through ``torch.save`` at ~100 µs each (see
    ``benchmarks/executor_transport.py``)."""

    inputs: Any

    @classmethod
    def of(cls, inputs: Any) -> "Step":
        return cls(_map_tensors(inputs, lambda t: t.cpu().numpy()))

    def unpack(self) -> Any:
        return _map_tensors(self.inputs, torch.from_numpy, np.ndarray)


def _map_tensors(value: Any, convert: Any, kind: type = torch.Tensor) -> Any:
    """A copy of dataclass ``value`` (nested ones too) with ``convert`` applied to each field
    of type ``kind``."""
    changes = {}
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if isinstance(item, kind):
            changes[field.name] = convert(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            changes[field.name] = _map_tensors(item, convert, kind)
    return dataclasses.replace(value, **changes)


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
