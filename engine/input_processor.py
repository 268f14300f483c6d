"""Input processing: a prompt and its parameters become validated ``Request`` objects (one per
sample), before anything is queued."""

from transformers import PreTrainedTokenizerBase

from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.parent_request import child_id, child_params
from kvserve.engine.core.request import Request
from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.lora.peft_adapter import LoRAAdapter
from kvserve.engine.sampling_params import SamplingParams, request_seed
from kvserve.engine.structured.compiler import GrammarCompiler
from kvserve.engine.structured.matcher import RequestGrammar


class InputProcessor:
    """Tokenizes, validates and builds requests. ``engine_seed`` (``--seed``) seeds the
    requests that give none: the k-th request built gets ``request_seed(engine_seed, k)``."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        max_model_len: int,
        kv: KVCacheManager,
        grammars: GrammarCompiler,
        engine_seed: int | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.kv = kv
        self.grammars = grammars
        self.engine_seed = engine_seed
        self._num_taken = 0  # requests built so far: the index of an unseeded one's seed

    def process(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        lora: LoRAAdapter | None = None,
    ) -> list[Request]:
        """The request's samples (one, or ``params.n`` with ids ``child_id``), under the
        adapter ``lora`` if one is given; ValueError, and nothing built, if it can never run."""
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._validate(token_ids, params)
        if params.n == 1:
            return [self._request(request_id, token_ids, text, params, arrival_time, lora)]
        return [
            self._request(child_id(request_id, i), token_ids, text, p, arrival_time, lora)
            for i, p in enumerate(child_params(params))
        ]

    def _request(
        self,
        request_id: str,
        token_ids: list[int],
        text: str | None,
        params: SamplingParams,
        arrival_time: float | None,
        lora: LoRAAdapter | None,
    ) -> Request:
        detokenizer = Detokenizer(
            self.tokenizer, token_ids, params.stop, params.skip_special_tokens
        )
        grammar = None
        if params.constraint is not None:
            grammar = RequestGrammar(self.grammars.submit(params.constraint))
        if params.seed is None and self.engine_seed is not None:
            params = params.replace(seed=request_seed(self.engine_seed, self._num_taken))
        self._num_taken += 1
        return Request(
            request_id,
            token_ids,
            params,
            text,
            arrival_time,
            detokenizer=detokenizer,
            grammar=grammar,
            lora=lora,
        )

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        vocab = self.vocab_size
        if not token_ids:
            raise ValueError("the prompt is empty")
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, which leaves no room to generate "
                f"within the model's context of {self.max_model_len} tokens"
            )
        needed = self.kv.blocks_needed(len(token_ids) + 1)
        if needed > self.kv.pool.num_blocks:
            raise ValueError(
                f"the prompt needs {needed} KV blocks but the cache has only "
                f"{self.kv.pool.num_blocks}"
            )
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
        ):
            if not all(0 <= t < vocab for t in ids):
                raise ValueError(f"invalid {name}: token ids must be in [0, {vocab})")
        for name, num in (
            ("logprobs", params.logprobs),
            ("prompt_logprobs", params.prompt_logprobs),
        ):
            if num is not None and num > vocab:
                raise ValueError(f"invalid {name}: {num} (must be at most the vocabulary, {vocab})")
