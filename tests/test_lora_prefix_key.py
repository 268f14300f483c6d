"""The adapter is part of the prefix-cache key: the same tokens under two adapters, or under
an adapter and the base model, never share a block; KV events carry the adapter's id and name."""

import msgpack

from kvserve.conformance.kv_events import BlockStored, decode_batch
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.kv_events import KVEventLog, encode_batch
from kvserve.engine.lora.peft_adapter import LoRAAdapter

from factories import make_request

TOKENS = list(range(100, 113))  # three full blocks of 4 and one token


def cached(kv: KVCacheManager, lora: LoRAAdapter | None):
    request = make_request(tokens=TOKENS)
    request.lora = lora
    hit = kv.computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - hit.num_blocks * 4, hit)
    request.num_computed_tokens = request.num_tokens
    kv.cache_computed_blocks(request)
    kv.free(request)
    return [b.block_id for b in hit.blocks[0]], request


def test_two_adapters_and_the_base_model_never_share_a_block():
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=True)
    a, b = LoRAAdapter("a", "/p/a", 8, {}, 1), LoRAAdapter("b", "/p/b", 8, {}, 2)
    a_again = LoRAAdapter("a", "/p/a", 8, {}, 3)  # reloaded: same name and path, same key
    moved = LoRAAdapter("a", "/q/a", 8, {}, 4)  # same name from elsewhere: another key
    assert cached(kv, None)[0] == []
    assert cached(kv, a)[0] == []
    assert cached(kv, b)[0] == []
    assert cached(kv, moved)[0] == []
    assert cached(kv, None)[0] == [0, 1, 2]
    assert cached(kv, a_again)[0] == [4, 5, 6]


def test_block_stored_carries_the_adapters_id_and_name():
    log = KVEventLog()
    kv = KVCacheManager(32, 4, True, log)
    cached(kv, None)
    cached(kv, LoRAAdapter("a", "/p/a", 8, {}, 7))
    base, adapter = log.take()
    assert (base.lora_id, base.lora_name, adapter.lora_id, adapter.lora_name) == (
        None,
        None,
        7,
        "a",
    )
    assert base.parent_block_hash is None and adapter.parent_block_hash is None
    assert set(base.block_hashes).isdisjoint(adapter.block_hashes)
    payload = encode_batch(0.0, [base, adapter], "CPU")
    _, events, _ = msgpack.unpackb(payload)
    assert events[0] == ["BlockStored", base.block_hashes, None, TOKENS[:12], 4, None, "CPU"]
    assert events[1] == ["BlockStored", adapter.block_hashes, None, TOKENS[:12], 4, 7, "CPU", "a"]
    decoded = decode_batch(payload).events[1]
    assert decoded == BlockStored(
        tuple(adapter.block_hashes), None, tuple(TOKENS[:12]), 4, 7, "CPU", "a"
    )


def test_blocks_of_two_adapters_with_one_name_are_two_events():
    log = KVEventLog()
    log.stored(b"1", None, [1, 2], 1, "a")
    log.stored(b"2", b"1", [3, 4], 2, "a")  # reloaded under a new id
    log.stored(b"3", b"2", [5, 6], 2, "a")
    assert [(e.block_hashes, e.lora_id) for e in log.take()] == [([b"1"], 1), ([b"2", b"3"], 2)]
