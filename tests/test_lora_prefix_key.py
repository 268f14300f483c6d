"""The adapter is part of the prefix-cache key: the same tokens under two adapters, or under
an adapter and the base model, never share a block; KV events name the adapter."""

import msgpack

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
    a, b = LoRAAdapter("a", "/p/a", 8, {}), LoRAAdapter("b", "/p/b", 8, {})
    a_again = LoRAAdapter("a", "/p/a", 8, {})  # reloaded: same name and path, same key
    moved = LoRAAdapter("a", "/q/a", 8, {})  # same name from elsewhere: another key
    assert cached(kv, None)[0] == []
    assert cached(kv, a)[0] == []
    assert cached(kv, b)[0] == []
    assert cached(kv, moved)[0] == []
    assert cached(kv, None)[0] == [0, 1, 2]
    assert cached(kv, a_again)[0] == [4, 5, 6]


def test_block_stored_names_the_adapter():
    log = KVEventLog()
    kv = KVCacheManager(32, 4, True, log)
    cached(kv, None)
    cached(kv, LoRAAdapter("a", "/p/a", 8, {}))
    base, adapter = log.take()
    assert (base.lora_name, adapter.lora_name) == (None, "a")
    assert base.parent_block_hash is None and adapter.parent_block_hash is None
    assert set(base.block_hashes).isdisjoint(adapter.block_hashes)
    _, events, _ = msgpack.unpackb(encode_batch(0.0, [base, adapter], "CPU"))
    assert events[0][5:] == [None, "CPU"]
    assert events[1][5:] == [None, "CPU", "a"]
