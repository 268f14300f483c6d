"""The engine loop: schedule, execute, sample, update."""

import logging
from collections.abc import Callable

import torch
from transformers import AutoTokenizer

from kvserve.engine.config import EngineConfig
from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.device_copy import to_device
from kvserve.engine.kv_cache_manager import KVCacheManager
from kvserve.engine.model_runner import ModelRunner, prompt_logprob_spans
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.outputs import CompletionOutput, RequestOutput
from kvserve.engine.request import Request
from kvserve.engine.sampler import Sampler, logprobs_of
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import Scheduler, SchedulerConfig, SchedulerStats

log = logging.getLogger(__name__)


class LLMEngine:
    """Requests in, tokens out, one ``step()`` at a time. Not thread-safe."""

    def __init__(
        self, config: EngineConfig, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = self._max_model_len()
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.runner = ModelRunner(config, self.model_config, self.max_model_len, progress)
        self.kv = KVCacheManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len),
            self.kv,
        )
        self.sampler = Sampler(self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        log.info(
            "loaded %s (%s) dtype=%s device=%s kv_blocks=%d x %d tokens, max_model_len=%d",
            config.model,
            self.model_config.family,
            self.runner.dtype,
            self.runner.device,
            self.runner.num_blocks,
            config.block_size,
            self.max_model_len,
        )

    def _max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.model_config.sliding_window:
            limit = min(limit, self.model_config.sliding_window)
        wanted = self.config.max_model_len or limit
        if wanted > limit:
            raise ValueError(f"max_model_len {wanted} exceeds the model's context of {limit}")
        return wanted

    @property
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request, or raise ValueError if it can never run."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if text is not None else list(prompt)
        self._validate(token_ids)
        vocab = self.model_config.vocab_size
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
        ):
            if not all(0 <= t < vocab for t in ids):
                raise ValueError(f"invalid {name}: token ids must be in [0, {vocab})")
        request = Request(request_id, token_ids, params, text, arrival_time)
        request.detokenizer = Detokenizer(
            self.tokenizer, token_ids, params.stop, params.skip_special_tokens
        )
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def _validate(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, which leaves no room to generate "
                f"within the model's context of {self.max_model_len} tokens"
            )
        needed = self.kv.blocks_needed(len(token_ids) + 1)
        if needed > self.runner.num_blocks:
            raise ValueError(
                f"the prompt needs {needed} KV blocks but the cache has only "
                f"{self.runner.num_blocks}"
            )

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.scheduler.abort(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        sampling = out.sampling_requests
        spans = prompt_logprob_spans(out)
        logits = self.runner.execute(out)
        sampled = self.sampler(logits[: len(sampling)], sampling)
        self._record_prompt_logprobs(spans, logits[len(sampling) :])
        for request, logprob in zip(sampling, sampled.logprobs, strict=True):
            if logprob is not None:
                request.logprobs.append(logprob)
        self.scheduler.update(out, sampled.token_ids, self.eos_token_ids)
        for request in sampling:
            if request.is_finished:
                del self.requests[request.request_id]
        return [self._output(r) for r in sampling]

    @staticmethod
    def _record_prompt_logprobs(spans: list[tuple[Request, range]], logits: torch.Tensor) -> None:
        row = 0
        for request, span in spans:
            rows = logits[row : row + len(span)]
            row += len(span)
            if len(request.prompt_logprobs) != span.start + 1:
                continue  # recomputed after a preemption: already recorded
            targets = request.prompt_token_ids[span.start + 1 : span.stop + 1]
            target_ids = to_device(targets, logits.device, torch.long)
            num_top = [request.params.prompt_logprobs or 0] * len(span)
            request.prompt_logprobs.extend(logprobs_of(rows, target_ids, num_top))

    def _output(self, request: Request) -> RequestOutput:
        tokens = request.output_token_ids
        detokenizer = request.detokenizer
        assert detokenizer is not None
        if request.is_finished:
            detokenizer.flush()
        text = detokenizer.output_text(request.is_finished)
        logprobs = list(request.logprobs) if request.params.logprobs is not None else None
        completion = CompletionOutput(
            0, tokens, text, request.finish_reason, request.stop_reason, logprobs
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=request.is_finished,
            num_cached_tokens=request.num_cached_prompt_tokens,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
            prompt_logprobs=list(request.prompt_logprobs)
            if request.params.prompt_logprobs is not None
            else None,
        )
