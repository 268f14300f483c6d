"""The offline API: a batch of prompts in, their completions out."""

import itertools
from collections.abc import Sequence
from typing import cast

from kvserve.engine.config import EngineConfig
from kvserve.engine.core.outputs import RequestOutput, join_outputs
from kvserve.engine.frozen_heap import frozen_heap
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """``LLM(model=PATH, **engine_settings).generate(prompts, params)``.

    Settings are those of ``EngineConfig``. ``generate`` takes one prompt or a
    list (strings or token-id lists) and one ``SamplingParams`` or one per
    prompt, runs them all with continuous batching and returns one output per
    prompt, in order: each the join of its request's deltas. ``lora_request`` (one for all
    prompts, or one per prompt, None for the base model) runs prompts under LoRA adapters
    (``enable_lora=True``).
    """

    def __init__(self, model: str, **settings) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **settings))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        one = isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
        batch = cast(list[Prompt], [prompts] if one else list(prompts))
        params = params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(batch)
        if len(params) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params)} sampling params")
        loras = (
            list(lora_request)
            if isinstance(lora_request, Sequence)
            else [lora_request] * len(batch)
        )
        if len(loras) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(loras)} LoRA requests")
        ids = [str(next(self._ids)) for _ in batch]
        added = []
        try:
            for request_id, prompt, p, lora in zip(ids, batch, params, loras, strict=True):
                self.engine.add_request(request_id, prompt, p, lora_request=lora)
                added.append(request_id)
        except ValueError:
            for request_id in added:
                self.engine.abort_request(request_id)
            raise
        deltas: dict[str, list[RequestOutput]] = {i: [] for i in ids}
        with frozen_heap():
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    deltas[output.request_id].append(output)
        return [join_outputs(deltas[i]) for i in ids]
