"""What the engine holds for speculative decoding: the proposer and the counts."""

from collections.abc import Iterable

from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.spec_decode.config import SpeculativeConfig
from kvserve.engine.spec_decode.draft_model import DraftModel, DraftModelProposer
from kvserve.engine.spec_decode.ngram import NgramProposer
from kvserve.engine.spec_decode.stats import SpecDecodeStats


class Speculator:
    """After each step, gives every request of it that stands at its last token (running,
    its KV computed up to that token) the drafts its next step verifies
    (``Request.spec_token_ids``): never more than its ``max_tokens`` leave after the token
    the verification adds, nor positions past ``max_model_len``. ``draft``: the runner's
    draft model (method ``draft_model``)."""

    def __init__(
        self,
        config: SpeculativeConfig,
        max_model_len: int,
        kv: KVCacheManager,
        draft: DraftModel | None = None,
    ) -> None:
        self.proposer: NgramProposer | DraftModelProposer
        if config.method == "draft_model":
            assert draft is not None  # EngineConfig allows it on one rank only
            self.proposer = DraftModelProposer(draft, kv, config.num_speculative_tokens)
        else:
            self.proposer = NgramProposer(config)
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats(config.num_speculative_tokens)

    def propose(self, requests: Iterable[Request]) -> None:
        ready, limits = [], []
        for request in requests:
            request.spec_token_ids = []
            if request.is_finished or request.num_computed_tokens != request.num_tokens - 1:
                continue
            limit = self.max_model_len - request.num_tokens
            if request.params.max_tokens is not None:
                limit = min(limit, request.params.max_tokens - request.num_output_tokens - 1)
            if limit > 0:
                ready.append(request)
                limits.append(limit)
        if ready:
            for request, drafts in zip(ready, self.proposer.propose(ready, limits), strict=True):
                request.spec_token_ids = drafts
