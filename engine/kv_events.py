"""KV-cache events: what the prefix-cache index did, in vLLM's and the llm-d router's format.

Followed: vLLM ``vllm/distributed/kv_events.py`` and ``vllm/config/kv_events.py`` (commit
b4e69e0: int hashes, no ``medium``; commit 0181ea3: ``medium``, ``lora_name``, ``extra_keys``,
``group_idx``, ``data_parallel_rank``), as the llm-d router decodes them: msgspec
``array_like`` structs, ``tag=True`` events (llm-d-kv-cache-manager a378f5b,
``pkg/kvcache/kvevents/{events,pool,zmq_subscriber}.go``, and its successor llm-d-kv-cache
7be76e1, ``pkg/kvevents/engineadapter/vllm_adapter.go``). A batch payload is msgpack::

    [ts (float64, unix seconds), [event, ...], 0 (data_parallel_rank)]

and each event an array led by its tag, the fields in llm-d's ``ToTaggedUnion`` order::

    ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, nil, medium]
    ["BlockStored", ..., block_size, lora_id, medium, lora_name]  (blocks of a LoRA adapter)
    ["BlockRemoved", [hash, ...], medium]
    ["AllBlocksCleared"]

``medium`` is "GPU" or "CPU", where the KV lives; ``lora_id`` (the adapter's
``lora_int_id``, as vLLM sends it) and ``lora_name``, vLLM's field after ``medium``, name the
adapter of a request's blocks (its first block's parent key is the adapter's, so the hashes
differ from the base model's too): nil and left out for the base model.
A block hash is kvserve's prefix-cache key as it is (``block_hash``: the 32-byte SHA-256
digest, the same in every process, so two pods that cache the same prefix publish the same
hashes), sent as msgpack bytes, as vLLM sends its sha256 keys (llm-d reads the last 8 bytes as
a uint64). Stored, removed and parent hashes are all written the same way, so they match each
other. The newer optional fields (``extra_keys``, ``group_idx``, ...) are left out, which
readers take as nil. The PUB frames around a payload are in ``kv_events_publisher``.
"""

import json
from dataclasses import dataclass, fields

import msgpack

from kvserve.engine.core.block_hash import BlockHash

DATA_PARALLEL_RANK = 0
_SCHEMES = ("tcp://", "ipc://", "inproc://")
_KIND_NAMES = {bool: "true or false", int: "an integer", str: "a string"}


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's ``--kv-events-config`` (same keys, same defaults). ``publisher`` defaults to
    "zmq" when ``enable_kv_cache_events`` is set, else "null"."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        kinds = {"enable_kv_cache_events": bool, "buffer_steps": int, "hwm": int}
        kinds |= {"max_queue_size": int, "publisher": str, "endpoint": str, "topic": str}
        for name, kind in kinds.items():
            value = getattr(self, name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"kv_events_config.{name} must be {_KIND_NAMES[kind]}: {value!r}")
        if self.publisher not in ("null", "zmq"):
            raise ValueError(f"kv_events_config.publisher must be null or zmq: {self.publisher!r}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.startswith(_SCHEMES)):
                raise ValueError(
                    f"kv_events_config.{name} must start with {', '.join(_SCHEMES)}: {value!r}"
                )
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < (1 if name == "max_queue_size" else 0):
                raise ValueError(f"kv_events_config.{name} is too small: {getattr(self, name)}")

    @classmethod
    def from_json(cls, text: str) -> "KVEventsConfig":
        """From the flag's JSON object; ``ValueError`` names a bad or unknown key."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv_events_config is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("kv_events_config must be a JSON object")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"kv_events_config has unknown keys: {', '.join(unknown)}")
        return cls(**data)

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


@dataclass
class BlockStored:
    """Chained full blocks cached: the first one's parent is ``parent_block_hash``."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[BlockHash]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventLog:
    """The prefix-cache index's changes since the last ``take``, in order. A block stored
    right after its parent joins the parent's ``BlockStored`` (one event per run of a
    request's blocks, as vLLM sends them); removals in a row share one ``BlockRemoved``."""

    def __init__(self) -> None:
        self._events: list[KVEvent] = []

    def stored(
        self,
        block_hash: BlockHash,
        parent_hash: BlockHash | None,
        token_ids: list[int],
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        last = self._events[-1] if self._events else None
        if (
            isinstance(last, BlockStored)
            and last.block_hashes[-1] == parent_hash
            and last.block_size == len(token_ids)
            and (last.lora_id, last.lora_name) == (lora_id, lora_name)
        ):
            last.block_hashes.append(block_hash)
            last.token_ids.extend(token_ids)
        else:
            self._events.append(
                BlockStored(
                    [block_hash], parent_hash, list(token_ids), len(token_ids), lora_id, lora_name
                )
            )

    def removed(self, block_hash: BlockHash) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(block_hash)
        else:
            self._events.append(BlockRemoved([block_hash]))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The events so far, which the log no longer touches; the log starts empty."""
        events, self._events = self._events, []
        return events


def encode_batch(ts: float, events: list[KVEvent], medium: str) -> bytes:
    """One batch's msgpack payload (the layout in the module docstring)."""
    return msgpack.packb([float(ts), [_encode(e, medium) for e in events], DATA_PARALLEL_RANK])


def _encode(event: KVEvent, medium: str) -> list:
    if isinstance(event, BlockStored):
        stored = [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            medium,
        ]
        return stored if event.lora_name is None else [*stored, event.lora_name]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, medium]
    return ["AllBlocksCleared"]
