"""Decode a model server's KV-cache event stream and replay it into a model of its prefix cache.

Written from the published format, the one vLLM's ``ZmqEventPublisher`` sends and the llm-d
router's ``kvevents`` package reads; it shares no code with kvserve's publisher, so a test
or the conformance command checks the server's stream against the format, not against itself.

A message on the PUB socket has three frames::

    [topic (utf-8, e.g. b"kv@<pod>@<model>"), seq (8 bytes, big-endian, unsigned), payload]

The payload is msgpack: a batch ``[ts, events]`` or ``[ts, events, data_parallel_rank]``
(msgspec ``array_like`` structs), each event an array led by its tag (msgspec ``tag=True``)::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id?, medium?, ...]
    ["BlockRemoved", block_hashes, medium?, ...]
    ["AllBlocksCleared"]

A block hash is a msgpack int or bytes (vLLM sent ints, then bytes; llm-d reads either).
Fields after those named are newer optional ones (lora_name, extra_keys, group_idx, ...) and
are skipped, as llm-d does. The replay socket (a ROUTER) answers ``[seq]`` (8 bytes) with one
``[seq, payload]`` reply per buffered batch from ``seq`` on, then ``[-1 (signed), b""]``.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

BlockHash = int | bytes
END_OF_REPLAY = -1
TOPIC_PREFIX = "kv"


class FormatError(ValueError):
    """The bytes do not follow the format; the message says which part and why."""


@dataclass(frozen=True)
class BlockStored:
    """Full blocks now cached: ``block_hashes[0]``'s parent is ``parent_block_hash`` (None: the
    first block of a sequence), each next block's parent is the one before it, and
    ``token_ids`` holds ``block_size`` tokens per block, in order."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


def decode_frames(frames: Sequence[bytes]) -> tuple[str, int, EventBatch]:
    """``(topic, seq, batch)`` of one PUB message."""
    if len(frames) != 3:
        raise FormatError(f"a message has 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    try:
        text = bytes(topic).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"the topic is not utf-8: {exc}") from exc
    return text, decode_seq(seq, signed=False), decode_batch(payload)


def decode_replay_frames(frames: Sequence[bytes]) -> tuple[int, EventBatch | None]:
    """``(seq, batch)`` of one replay reply as a REQ socket receives it (a DEALER strips the
    empty delimiter first); ``(END_OF_REPLAY, None)`` for the end marker."""
    if len(frames) != 2:
        raise FormatError(f"a replay reply has 2 frames (seq, payload), got {len(frames)}")
    seq = decode_seq(frames[0], signed=True)
    if seq == END_OF_REPLAY:
        if frames[1]:
            raise FormatError("the end-of-replay marker has a non-empty payload")
        return END_OF_REPLAY, None
    if seq < 0:
        raise FormatError(f"replay sequence number {seq} is negative")
    return seq, decode_batch(frames[1])


def decode_seq(frame: bytes, signed: bool) -> int:
    if len(frame) != 8:
        raise FormatError(f"a sequence number is 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=signed)


def parse_topic(topic: str) -> tuple[str, str]:
    """``(pod, model)`` of a ``kv@<pod>@<model>`` topic, as llm-d splits it."""
    parts = topic.split("@")
    if len(parts) != 3 or parts[0] != TOPIC_PREFIX or not parts[1] or not parts[2]:
        raise FormatError(f"the topic {topic!r} is not kv@<pod>@<model>")
    return parts[1], parts[2]


def decode_batch(payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise FormatError(f"the payload is not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise FormatError(f"a batch is [ts, events(, dp_rank)], got {_show(raw)}")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise FormatError(f"a batch's ts is a number, got {_show(ts)}")
    if not isinstance(events, list):
        raise FormatError(f"a batch's events are an array, got {_show(events)}")
    if rank is not None and not _is_int(rank):
        raise FormatError(f"a batch's data_parallel_rank is an int or nil, got {_show(rank)}")
    return EventBatch(float(ts), tuple(decode_event(e) for e in events), rank)


def decode_event(raw: Any) -> Event:
    """One event from its decoded msgpack array."""
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
        raise FormatError(f"an event is an array led by its tag, got {_show(raw)}")
    tag, fields = raw[0], raw[1:]
    if tag == "BlockStored":
        if len(fields) < 4:
            raise FormatError(f"BlockStored has at least 4 fields, got {len(fields)}")
        hashes, parent, tokens, size = fields[:4]
        lora_id = _optional(fields, 4, _is_int, "BlockStored.lora_id")
        medium = _optional(fields, 5, _is_str, "BlockStored.medium")
        lora_name = _optional(fields, 6, _is_str, "BlockStored.lora_name")
        if parent is not None and not _is_hash(parent):
            raise FormatError(f"BlockStored.parent_block_hash: {_show(parent)}")
        if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
            raise FormatError(f"BlockStored.token_ids is an array of token ids: {_show(tokens)}")
        if not _is_int(size) or size < 1:
            raise FormatError(f"BlockStored.block_size is a positive int, got {_show(size)}")
        return BlockStored(
            _hashes(hashes, "BlockStored"), parent, tuple(tokens), size, lora_id, medium, lora_name
        )
    if tag == "BlockRemoved":
        if not fields:
            raise FormatError("BlockRemoved has at least 1 field, got 0")
        medium = _optional(fields, 1, _is_str, "BlockRemoved.medium")
        return BlockRemoved(_hashes(fields[0], "BlockRemoved"), medium)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise FormatError(f"unknown event tag {tag!r}")


class CacheModel:
    """The prefix cache as a subscriber rebuilds it: block hash -> parent hash and token ids.

    ``apply`` never raises; what the stream gets wrong lands in ``problems``: a block stored
    while already cached, a block removed that is not cached, token ids that are not
    ``block_size`` per block. A parent that is not cached is no problem: a parent may be
    evicted before its child, or before a request that computed the same prefix itself
    stores the child.
    """

    def __init__(self) -> None:
        self.parents: dict[BlockHash, BlockHash | None] = {}
        self.tokens: dict[BlockHash, tuple[int, ...]] = {}
        self.problems: list[str] = []

    @property
    def blocks(self) -> set[BlockHash]:
        return set(self.parents)

    def apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    if self.parents.pop(block_hash, _ABSENT) is _ABSENT:
                        self.problems.append(f"removed {block_hash!r}, which is not cached")
                    self.tokens.pop(block_hash, None)
            else:
                self.parents.clear()
                self.tokens.clear()

    def _store(self, event: BlockStored) -> None:
        size, hashes = event.block_size, event.block_hashes
        if len(event.token_ids) != size * len(hashes):
            self.problems.append(
                f"{len(hashes)} blocks of {size} tokens stored with {len(event.token_ids)} tokens"
            )
            return
        parent = event.parent_block_hash
        for index, block_hash in enumerate(hashes):
            if block_hash in self.parents:
                self.problems.append(f"stored {block_hash!r}, which is already cached")
            self.parents[block_hash] = parent
            self.tokens[block_hash] = event.token_ids[index * size : (index + 1) * size]
            parent = block_hash


_ABSENT = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_hash(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, bytes) and len(value) > 0)


def _hashes(value: Any, tag: str) -> tuple[BlockHash, ...]:
    if not isinstance(value, list) or not value or not all(_is_hash(h) for h in value):
        raise FormatError(f"{tag}.block_hashes is a non-empty array of hashes: {_show(value)}")
    return tuple(value)


def _optional(fields: list, index: int, check, name: str) -> Any:
    if index >= len(fields) or fields[index] is None:
        return None
    if not check(fields[index]):
        raise FormatError(f"{name}: {_show(fields[index])}")
    return fields[index]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
