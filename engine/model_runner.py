"""Weights and KV tensors; one flat batch per step through the model."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.attention.backend import select_backend
from kvserve.engine.attention.metadata import AttentionMetadata
from kvserve.engine.config import DEFAULT_CPU_KV_CACHE_GB, EngineConfig
from kvserve.engine.cuda_graphs import DecodeGraphs, capture_sizes, use_cuda_graphs
from kvserve.engine.device_copy import to_device
from kvserve.engine.kv_cache_sizing import cuda_kv_cache_blocks
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import SchedulerOutput
from kvserve.engine.startup import StartupPhases


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # rows whose logits are sampled, one per sampling request


def prompt_logprob_spans(out: SchedulerOutput) -> list[tuple[Request, range]]:
    """For each scheduled request that asks for prompt logprobs, the positions computed
    this step whose logits score the next prompt token."""
    spans = []
    for request, num_new in out.scheduled:
        if request.params.prompt_logprobs is not None:
            start = request.num_computed_tokens
            end = min(start + num_new, request.num_prompt_tokens - 1)
            if end > start:
                spans.append((request, range(start, end)))
    return spans


class ModelRunner:
    """Loads the model, owns the paged KV cache and runs each step's batch.

    The batch is flat and unpadded: the scheduled tokens of every request,
    concatenated in scheduling order. Only the last row of each request that
    completes its tokens this step goes through the LM head.
    """

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        max_model_len: int,
        progress: Callable[[int, int], None] | None = None,
        startup: StartupPhases | None = None,
    ) -> None:
        self.startup = startup or StartupPhases()
        self.config = config
        self.model_config = model_config
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(model_config.torch_dtype, self.device)
        self.block_size = config.block_size
        self.backend = select_backend(self.device, config.attention_backend)
        with self.startup.measure("load", self.device):
            self.model = load_model(
                config.model,
                model_config,
                self.backend,
                max_model_len,
                self.dtype,
                self.device,
                progress,
            )
        with self.startup.measure("kv_alloc", self.device):
            self.num_blocks = self._num_blocks(max_model_len)
            shape = (
                self.num_blocks, self.block_size, model_config.num_kv_heads, model_config.head_dim
            )  # fmt: skip
            self.kv_caches = [
                (
                    torch.zeros(shape, dtype=self.dtype, device=self.device),
                    torch.zeros(shape, dtype=self.dtype, device=self.device),
                )
                for _ in range(model_config.num_layers)
            ]
        self.forward: Callable[..., torch.Tensor] = self.model
        with self.startup.measure("warmup", self.device):
            if use_cuda_graphs(self.device, self.backend.name, config.enforce_eager):
                sizes = capture_sizes(config.max_num_seqs)
                max_blocks = -(-max_model_len // self.block_size)
                self.forward = DecodeGraphs(
                    self.model, self.kv_caches, sizes, max_blocks, self.device
                )
            self._warm_up()

    def _warm_up(self) -> None:
        """One step of one token in block 0: kernels compile and buffers are allocated now,
        not in the first request's step. The key and value it writes sit in a free block,
        which a request overwrites before it reads them."""
        request = Request("warmup", [0], SamplingParams(max_tokens=1))
        request.block_ids = [0]
        self.execute(SchedulerOutput([(request, 1)]))

    @property
    def block_bytes(self) -> int:
        cfg = self.model_config
        per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize
        return per_token * self.block_size

    def _num_blocks(self, max_model_len: int) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.config.kv_cache_memory_gb is None and self.device.type == "cuda":
            return cuda_kv_cache_blocks(
                self.model, self.config, max_model_len, self.block_bytes, self.dtype, self.device
            )
        if self.config.kv_cache_memory_gb is not None:
            budget_gb = self.config.kv_cache_memory_gb
            blocks = int(budget_gb * 2**30) // self.block_bytes
            if blocks < 1:
                raise ValueError(f"a KV budget of {budget_gb:.3f} GiB holds no block")
            return blocks
        # CPU default: what max_num_seqs full contexts need, within DEFAULT_CPU_KV_CACHE_GB
        full_contexts = self.config.max_num_seqs * -(-max_model_len // self.block_size)
        return min(full_contexts, int(DEFAULT_CPU_KV_CACHE_GB * 2**30) // self.block_bytes)

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        bs = self.block_size
        ids: list[int] = []
        positions, slots, query_lens, seq_lens = [], [], [], []
        tables = np.zeros(
            (len(out.scheduled), max(len(r.block_ids) for r, _ in out.scheduled)), dtype=np.int32
        )
        for row, (request, num_new) in enumerate(out.scheduled):
            start = request.num_computed_tokens
            ids.extend(request.all_token_ids[start : start + num_new])
            table = np.asarray(request.block_ids, dtype=np.int64)
            pos = np.arange(start, start + num_new)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            tables[row, : len(table)] = table
            query_lens.append(num_new)
            seq_lens.append(start + num_new)
        ends = np.cumsum(query_lens)
        sampled = [
            row
            for row, (r, n) in enumerate(out.scheduled)
            if r.num_computed_tokens + n == r.num_tokens
        ]
        logits_rows = [ends[sampled] - 1]
        first_row = {id(r): end - n for (r, n), end in zip(out.scheduled, ends, strict=True)}
        for request, span in prompt_logprob_spans(out):
            offset = first_row[id(request)] - request.num_computed_tokens
            logits_rows.append(np.arange(span.start, span.stop) + offset)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=to_device(np.concatenate(slots), dev),
            query_start_loc=to_device(np.concatenate([[0], ends]), dev, torch.int32),
            seq_lens=to_device(seq_lens, dev, torch.int32),
            block_tables=to_device(tables, dev),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )
        return StepInputs(
            input_ids=to_device(ids, dev, torch.long),
            positions=to_device(np.concatenate(positions), dev),
            meta=meta,
            logits_indices=to_device(np.concatenate(logits_rows), dev),
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Run the step; fp32 logits ``[num_sampling_requests, vocab]``, followed by the
        rows of ``prompt_logprob_spans(out)`` in order."""
        inputs = self.prepare(out)
        hidden = self.forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        return self.model.logits(hidden[inputs.logits_indices])
