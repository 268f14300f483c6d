"""The prefix cache's block keys: a content hash, the same in every process, that colliding
Python hashes no longer fool."""

import hashlib
import subprocess
import sys

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.engine.core.block_hash import ROOT_PARENT, sha256_chain
from kvserve.engine.core.kv_cache_manager import KVCacheManager

from factories import make_request

FIRST = "f45ae930310c74ad5e1e4338a12048048fd20fb584c5733766b7126cc80da15a"
SECOND = "8a4093024caf2419d0125f268be69519f61d2aab1716f5e837ac92d5a5c307b3"

CACHED_HASHES = """
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.sampling_params import SamplingParams
kv = KVCacheManager(8, 4, True)
r = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=1))
kv.allocate_slots(r, r.num_tokens)
r.num_computed_tokens = r.num_tokens
kv.cache_computed_blocks(r)
print(" ".join(h.hex() for h in r.block_hashes))
"""


def cached(kv: KVCacheManager, tokens: list[int]):
    request = make_request(tokens=tokens)
    assert kv.allocate_slots(request, request.num_tokens)
    request.num_computed_tokens = request.num_tokens
    kv.cache_computed_blocks(request)
    return request


def test_a_block_key_is_sha256_of_the_parent_key_the_count_and_the_token_ids():
    layout = ROOT_PARENT + (4).to_bytes(4, "little")
    layout += b"".join(t.to_bytes(8, "little", signed=True) for t in (1, 2, 3, 4))
    assert sha256_chain(None, [1, 2, 3, 4]) == hashlib.sha256(layout).digest()
    assert sha256_chain(None, [1, 2, 3, 4]).hex() == FIRST
    assert sha256_chain(bytes.fromhex(FIRST), [5, 6, 7, 8]).hex() == SECOND


def test_two_processes_key_the_same_prefix_the_same():
    run = [sys.executable, "-c", CACHED_HASHES]
    seen = {subprocess.run(run, capture_output=True, text=True, check=True).stdout for _ in "ab"}
    assert seen == {f"{FIRST} {SECOND}\n"}
    here = cached(KVCacheManager(8, 4, True), list(range(1, 10))).block_hashes
    assert [h.hex() for h in here] == [FIRST, SECOND]


@pytest.mark.parametrize("other", [2**61 - 1 + 5, -1])
def test_blocks_whose_python_hashes_collide_share_no_cached_block(other):
    """``hash(x) == hash(x + 2**61 - 1)`` and ``hash(-1) == hash(-2)``: under the old key,
    ``hash((parent, *tokens))``, the second prompt found the first one's block."""
    mine, theirs = [1, 2, 3, 5 if other > 0 else -2], [1, 2, 3, other]
    assert hash((None, *mine)) == hash((None, *theirs))
    kv = KVCacheManager(8, 4, True)
    cached(kv, [*mine, 9])
    assert kv.computed_blocks(make_request(tokens=[*mine, 7])).blocks == [[kv.pool.blocks[0]]]
    assert kv.computed_blocks(make_request(tokens=[*theirs, 7])).blocks == [[]]


def test_an_unknown_hash_algorithm_is_refused_naming_the_setting():
    with pytest.raises(ValueError) as error:
        EngineConfig(model="m", prefix_caching_hash_algo="builtin")
    assert str(error.value) == "prefix_caching_hash_algo must be one of ['sha256'], got 'builtin'"
