"""Small factories for scheduler and cache tests."""

import itertools
from collections.abc import Sequence

from kvserve.engine.core.kv_cache_manager import DENSE, KVCacheManager
from kvserve.engine.core.kv_groups import KVGroup
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import Scheduler, SchedulerConfig
from kvserve.engine.sampling_params import SamplingParams

_ids = itertools.count()


def make_request(num_tokens: int = 8, tokens: list[int] | None = None, **params) -> Request:
    tokens = tokens if tokens is not None else list(range(1, num_tokens + 1))
    params.setdefault("max_tokens", 4)
    params.setdefault("temperature", 0)
    return Request(f"r{next(_ids)}", tokens, SamplingParams(**params))


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    caching: bool = False,
    long_prefill_token_threshold: int = 0,
    groups: Sequence[KVGroup] = DENSE,
    num_state_slots: int = 0,
) -> Scheduler:
    kv = KVCacheManager(
        num_blocks, block_size, caching, groups=groups, num_state_slots=num_state_slots
    )
    config = SchedulerConfig(
        max_num_seqs, max_num_batched_tokens, max_model_len, long_prefill_token_threshold
    )
    return Scheduler(config, kv)


def finish_step(scheduler: Scheduler, out, token: int = 99) -> None:
    """Pretend the model ran: every sampling request gets ``token``."""
    scheduler.update(out, [token] * len(out.sampling_requests), eos_token_ids={0})
