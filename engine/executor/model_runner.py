"""One rank's weights and KV tensors; one flat batch per step through the model.

Rank 0 (in the engine's process) ``prepare``s each step's inputs from the scheduler's
output; every rank ``run``s them (the layers' collectives meet inside the forward and the LM
head). With one rank, ``execute`` is both, exactly the path of an engine without an executor.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from kvserve.engine import host_allocator
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import SchedulerOutput
from kvserve.engine.device_copy import to_device
from kvserve.engine.execution_plan import ExecutionPlan
from kvserve.engine.executor.input_batch import InputBatch
from kvserve.engine.executor.kv_pages import layer_caches
from kvserve.engine.graphs.cpu_graphs import CPUDecodeGraphs
from kvserve.engine.graphs.cuda_graphs import CUDAGraphs
from kvserve.engine.graphs.graph_buckets import MixedBuckets, capture_sizes
from kvserve.engine.graphs.padded_steps import PaddedSteps
from kvserve.engine.graphs.static_batch import STATE
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.lora.lora_slots import LoRASlots
from kvserve.engine.lora.peft_adapter import LoRAAdapter
from kvserve.engine.models.decoder import StepMetadata
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.spec_decode.decode_rows import as_decode_rows
from kvserve.engine.spec_decode.draft_kv import draft_config
from kvserve.engine.spec_decode.draft_model import DraftModel
from kvserve.engine.startup import StartupPhases


@dataclass
class StepInputs:
    """What every rank needs of one step; rank 0 builds it (``ModelRunner.prepare``) and
    the executor hands it to the other ranks."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: StepMetadata
    logits_indices: torch.Tensor  # rows whose logits are sampled: each sampling request's
    # last one, and one per draft token it verifies
    every_row: bool  # logits_indices are all the rows, in order (as in a decode-only step)
    lora_rows: np.ndarray | None = None  # each row's LoRA slot (-1: base model); None: none
    lora_fills: list[tuple[int, LoRAAdapter]] = dataclasses.field(default_factory=list)
    """(slot, adapter): the adapters each rank loads into a slot before the step."""


class ModelRunner:
    """Loads the model (rank ``tp.rank``'s shard of it), owns that rank's part of the paged
    KV cache (``tp.kv_heads`` of every block) and of the linear-attention layers' state slots
    (``kv_caches[layer]`` of such a layer is its ``(conv_state, ssm_state)``), and runs each
    step's batch, as ``plan`` says;
    ``self.plan`` is that plan with its KV blocks measured where they had to be (on several
    ranks, the fewest any rank measured, so that a block id means the same on each).

    The batch is flat and unpadded: the scheduled tokens of every request,
    concatenated in scheduling order. Only the last row of each request that
    completes its tokens this step goes through the LM head. The running requests' block
    tables stay in ``input_batch`` from step to step (rank 0's; ``prepare`` gathers them).
    """

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        plan: ExecutionPlan,
        progress: Callable[[int, int], None] | None = None,
        startup: StartupPhases | None = None,
        tp: TensorParallel | None = None,
        pp: PipelineParallel | None = None,
    ) -> None:
        self.startup = startup or StartupPhases()
        self.tp = tp = tp or TensorParallel()
        self.pp = pp = pp or PipelineParallel()
        device, dtype = plan.device, plan.dtype
        with self.startup.measure("load", device):
            self.model = load_model(
                config.model,
                model_config,
                plan.backend,
                plan.max_model_len,
                dtype,
                device,
                progress,
                plan.packed_linears,
                tp=tp,
                pp=pp,
            )
        self.lora: LoRASlots | None = None
        if config.enable_lora:
            self.lora = LoRASlots(self.model, config.max_loras, config.max_lora_rank, device)
        self.draft: DraftModel | None = None
        if draft_config(config) is not None:  # before the KV cache is sized next to it
            with self.startup.measure("load", device):
                self.draft = DraftModel(config, model_config, plan)
        with self.startup.measure("kv_alloc", device):
            if plan.num_kv_blocks is None:
                if pp.size > 1:
                    raise ValueError(
                        "pipeline_parallel_size > 1 needs the KV cache's size set "
                        "(num_kv_blocks or kv_cache_memory_gb): a stage is not profiled"
                    )
                plan = plan.with_measured_kv_blocks(self.model, config)
                plan = dataclasses.replace(plan, num_kv_blocks=self._fewest(plan))
            elif pp.size > 1:  # each stage sized its blocks by its own layers
                plan = dataclasses.replace(plan, num_kv_blocks=self._fewest(plan))
            self.plan = plan
            assert plan.num_kv_blocks is not None
            self.kv_caches, self.layer_groups = layer_caches(
                model_config,
                plan.kv_groups,
                plan.num_kv_blocks,
                plan.block_size,
                plan.kv_cache_dtype,
                device,
                tp,
                pp.layers(model_config.num_layers) if pp.size > 1 else None,
            )
            if self.draft is not None:
                self.draft.allocate_kv(plan.num_kv_blocks)
            self.linear_layers = model_config.linear_layers
            if plan.num_state_slots:
                assert model_config.gated_delta_net is not None
                spec = model_config.gated_delta_net.state_spec(tp.size, dtype)
                for layer in self.linear_layers:
                    self.kv_caches[layer] = spec.allocate(plan.num_state_slots, device)
        self.input_batch = InputBatch(
            len(plan.kv_groups), plan.max_num_seqs, plan.max_blocks_per_seq, plan.block_size, device
        )
        if device.type == "cpu":
            host_allocator.keep_step_memory()
        self.forward: Callable[..., torch.Tensor] = self.model
        with self.startup.measure("warmup", device):
            layout = self._static_layout()
            if plan.cuda_graphs:
                sizes = capture_sizes(plan.max_num_seqs)
                mixed_tokens = min(config.max_cudagraph_capture_size, plan.max_num_batched_tokens)
                mixed = MixedBuckets(mixed_tokens, plan.max_num_seqs) if mixed_tokens > 1 else None
                self.forward = CUDAGraphs(
                    PaddedSteps(
                        self.model, self.kv_caches, sizes, mixed, plan.max_blocks_per_seq,
                        device, layout,
                    )
                )  # fmt: skip
            elif plan.cpu_graphs:
                self.forward = CPUDecodeGraphs(
                    self.model,
                    self.kv_caches,
                    plan.max_num_seqs,
                    plan.max_blocks_per_seq,
                    layout=layout,
                )
            self._warm_up()

    def _static_layout(self) -> list[int]:
        """Each layer's KV group or ``STATE``, as ``prepare`` lays out a step's metadata (empty
        where it is one ``AttentionMetadata`` for every layer)."""
        if len(self.plan.kv_groups) == 1 and not self.linear_layers:
            return []
        layout = list(self.layer_groups)
        for layer in self.linear_layers:
            layout[layer] = STATE
        return layout

    def _fewest(self, plan: ExecutionPlan) -> int:
        """The fewest KV blocks any rank measured room for."""
        assert plan.num_kv_blocks is not None
        group = self.pp.group if self.pp.size > 1 else self.tp.group
        if group is None:
            return plan.num_kv_blocks
        count = torch.tensor([plan.num_kv_blocks], dtype=torch.int64, device=plan.device)
        dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
        return int(count.item())

    def _warm_up(self) -> None:
        """One step of one token in block 0: kernels compile and buffers are allocated now,
        not in the first request's step. The key and value it writes sit in a free block,
        which a request overwrites before it reads them. Every rank builds this step itself
        (it is the same on each), so the ranks' first collectives meet without the executor."""
        request = Request("warmup", [0], SamplingParams(max_tokens=1))
        request.block_tables = [[0] for _ in self.plan.kv_groups]
        request.num_skipped_blocks = [0] * len(self.plan.kv_groups)
        request.state_slot = 0 if self.plan.num_state_slots else None
        out = SchedulerOutput()
        out.add(request, 1)
        self.run(self.prepare(out))

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """The step's inputs; a model of several KV groups gets one ``AttentionMetadata``
        per layer (its group's block tables and slots, the rest shared), and one with
        linear-attention layers a ``StateMetadata`` for those (each request's state slot).
        Block tables and slots come from the requests' rows of ``input_batch``."""
        requests = [r for r, _ in out.scheduled]
        query_lens = [n for _, n in out.scheduled]
        ids = [t for r, n in out.scheduled for t in out.input_token_ids(r, n)]
        rows = self.input_batch.rows(requests)
        lens = np.array(query_lens, dtype=np.int64)
        starts = np.array([r.num_computed_tokens for r in requests], dtype=np.int64)
        query_start_loc_host = np.zeros(len(lens) + 1, dtype=np.int64)
        ends = np.cumsum(lens, out=query_start_loc_host[1:])
        # a request's batch rows hold its positions from num_computed_tokens on, in order
        positions = _ranges(starts, lens, len(ids))
        seq_lens_array = starts + lens
        seq_lens = seq_lens_array.tolist()
        token_rows = rows if len(ids) == len(rows) else np.repeat(rows, lens)
        slots = self.input_batch.slot_mappings(token_rows, positions)
        table_rows = rows
        if self._verifies_as_decodes(out):
            query_lens, seq_lens, table_rows = as_decode_rows(query_lens, seq_lens, rows)
            query_start_loc_host, seq_lens_array = np.arange(len(ids) + 1), np.array(seq_lens)
        width = int(self.input_batch.num_blocks[rows].max())
        tables = self.input_batch.block_tables(table_rows, width)
        logits_rows, every_row = _logits_rows(out, ends)
        dev = self.plan.device
        lora_rows: np.ndarray | None = None
        lora_fills: list[tuple[int, LoRAAdapter]] = []
        if self.lora is not None:
            lora_rows, lora_fills = self._lora_rows(out, lens)
        query_start_loc = to_device(query_start_loc_host, dev, torch.int32)
        seq_lens_dev = to_device(seq_lens_array, dev, torch.int32)
        metas = [
            AttentionMetadata(
                slot_mapping=to_device(slots[group], dev),
                query_start_loc=query_start_loc,
                seq_lens=seq_lens_dev,
                block_tables=tables[group],
                query_lens_host=query_lens,
                seq_lens_host=seq_lens,
                max_query_len=max(query_lens),
                max_seq_len=max(seq_lens),
            )
            for group in range(len(tables))
        ]
        meta: StepMetadata = metas[0]
        if len(metas) > 1 or self.linear_layers:
            meta = [metas[g] for g in self.layer_groups]
            if self.linear_layers:
                state = self._state_metadata(out, query_start_loc, [0, *ends.tolist()])
                for layer in self.linear_layers:
                    meta[layer] = state
        return StepInputs(
            input_ids=to_device(ids, dev, torch.long),
            positions=to_device(positions, dev),
            meta=meta,
            logits_indices=to_device(logits_rows, dev),
            every_row=every_row,
            lora_rows=lora_rows,
            lora_fills=lora_fills,
        )

    def _verifies_as_decodes(self, out: SchedulerOutput) -> bool:
        """Whether the step's attention runs as one decode sequence a row
        (``spec_decode.decode_rows``): on a CPU, a step of decoding requests only, some
        verifying drafts, of a model of one KV group without linear-attention layers,
        LoRA or a draft model."""
        return (
            self.plan.device.type == "cpu"
            and bool(out.spec_token_ids)
            and len(self.plan.kv_groups) == 1
            and not self.linear_layers
            and self.lora is None
            and self.draft is None
            and len(out.sampling_requests) == len(out.scheduled)
            and all(n == 1 + out.num_drafts(r) for r, n in out.scheduled)
        )

    def _lora_rows(
        self, out: SchedulerOutput, lens: np.ndarray
    ) -> tuple[np.ndarray | None, list[tuple[int, LoRAAdapter]]]:
        """Each row's LoRA slot (None when no request of the step runs under an adapter),
        and the slot fills that make the step's adapters resident; ``lens``: each
        request's rows."""
        assert self.lora is not None
        adapters = {r.lora.serial: r.lora for r, _ in out.scheduled if r.lora is not None}
        if not adapters:
            return None, []
        slots, fills = self.lora.assign(list(adapters.values()))
        per_request = [-1 if r.lora is None else slots[r.lora.serial] for r, _ in out.scheduled]
        return np.repeat(np.array(per_request, dtype=np.int64), lens), fills

    def _state_metadata(
        self, out: SchedulerOutput, query_start_loc: torch.Tensor, starts: list[int]
    ) -> StateMetadata:
        """Each scheduled request's state slot, and whether it holds a state already."""
        dev = self.plan.device
        slots = [r.state_slot for r, _ in out.scheduled]
        if None in slots:
            raise RuntimeError(
                "a request of a linear-attention model was scheduled without a state slot"
            )
        return StateMetadata(
            query_start_loc=query_start_loc,
            state_slots=to_device(slots, dev, torch.int32),
            has_initial_state=to_device(
                [r.num_computed_tokens > 0 for r, _ in out.scheduled], dev, torch.bool
            ),
            query_start_loc_host=starts,
        )

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Prepare and run the step (one rank: the whole of it); see ``run``."""
        return self.run(self.prepare(out))

    def shutdown(self) -> None:
        """Nothing to stop: one rank has no worker."""

    def check_health(self) -> None:
        """One rank in this process: healthy while the process runs."""

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Run a prepared step on this rank; fp32 logits: a row per sampling request (and
        one per draft token it verifies, after it), followed by the rows of
        ``out.prompt_logprob_spans`` in order (every rank gets all of them: the LM head
        gathers them). Only those rows go through the last layer's output projection and
        MLP (see ``DecoderLM.forward``). With a draft model, it computes its KV for the same
        tokens too."""
        rows = None if inputs.every_row else inputs.logits_indices
        if self.pp.size > 1:
            return self._run_stage(inputs, rows)
        if self.lora is not None:
            # the LoRA layers' row groups span the whole batch: every row runs every layer
            for slot, adapter in inputs.lora_fills:
                self.lora.load(slot, adapter)
            self.lora.set_rows(inputs.lora_rows)
            hidden = self.forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
            logits = self.model.logits(hidden if rows is None else hidden[rows])
        else:
            hidden = self.forward(
                inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, rows
            )
            logits = self.model.logits(hidden)
        if self.draft is not None:  # the draft's KV for the same tokens (speculative decoding)
            self.draft.forward_step(inputs.input_ids, inputs.positions, inputs.meta)
        return logits

    def _run_stage(self, inputs: StepInputs, rows: torch.Tensor | None) -> torch.Tensor:
        """This pipeline stage's part of the step (``_stage_forward``); the logits on the
        last stage and on world rank 0 (which receives them), an empty tensor elsewhere."""
        logits = self._stage_forward(inputs, rows)
        if logits is not None:
            return logits
        if self.pp.is_first and self.pp.tp_rank == 0:
            return self._recv_logits(inputs, rows)
        return inputs.positions.new_empty(0, dtype=torch.float32)

    def run_micro_batches(self, batches: list[StepInputs]) -> list[torch.Tensor]:
        """World rank 0 of a pipeline: each micro-batch through this first stage, its sends
        left in flight so that the next one is computed while the next stage runs it; then
        every micro-batch's logits, from the last stage."""
        pending: list[Any] = []
        rows = [None if b.every_row else b.logits_indices for b in batches]
        for inputs, batch_rows in zip(batches, rows, strict=True):
            self._stage_forward(inputs, batch_rows, pending)
        logits = [self._recv_logits(b, r) for b, r in zip(batches, rows, strict=True)]
        self.pp.wait_all(pending)
        return logits

    def _recv_logits(self, inputs: StepInputs, rows: torch.Tensor | None) -> torch.Tensor:
        count = len(inputs.input_ids) if rows is None else len(rows)
        return self.pp.recv_logits(count, self.model.config.vocab_size, self.plan.device)

    @torch.inference_mode()
    def _stage_forward(
        self, inputs: StepInputs, rows: torch.Tensor | None, pending: list[Any] | None = None
    ) -> torch.Tensor | None:
        """From the tokens (first stage) or the previous stage's residual stream, through
        this stage's layers, to the next stage (None; its sends in flight in ``pending``, if
        given) or to the logits (last stage, which sends them to world rank 0 too)."""
        pp, model = self.pp, self.model
        if pp.is_first:
            hidden, residual = model.embed_tokens(inputs.input_ids), None
        else:
            like = torch.empty(
                len(inputs.input_ids), model.config.hidden_size, dtype=self.plan.dtype,
                device=self.plan.device,
            )  # fmt: skip
            hidden, residual = pp.recv_prev(2, like)
        hidden, residual = model.run_layers(
            hidden, inputs.positions, self.kv_caches, inputs.meta, rows, residual
        )
        if not pp.is_last:
            pp.send_next(hidden, residual, pending=pending)
            return None
        logits = model.logits(residual + hidden)
        if pp.sends_logits:
            pp.send_logits(logits)
        return logits


def _ranges(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """``arange(starts[i], starts[i] + counts[i])`` for each ``i``, concatenated; ``total``:
    the sum of ``counts`` (each at least 1), which is ``starts`` itself when every count is 1
    (a decode step)."""
    if total == len(counts):
        return starts
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts - firsts, counts) + np.arange(total)


def _logits_rows(out: SchedulerOutput, ends: np.ndarray) -> tuple[np.ndarray, bool]:
    """The batch rows whose logits the step returns: each sampling request's last token's
    and, after it, each of its drafts' (its rows' last ones), in batch order; then the rows
    of ``out.prompt_logprob_spans``. And whether they are every row, in order. ``ends``:
    each scheduled request's rows' end."""
    scheduled = out.scheduled
    rows = ends - 1  # when every request samples without drafts: each one's last row
    if out.spec_token_ids or len(out.sampling_requests) < len(scheduled):
        drafts = np.array([out.num_drafts(r) for r, _ in scheduled], dtype=np.int64)
        sampling = {id(r) for r in out.sampling_requests}
        mask = np.array([id(r) in sampling for r, _ in scheduled], dtype=bool)
        rows = _ranges((rows - drafts)[mask], (drafts + 1)[mask], out.num_sampling_rows)
    num_rows = int(ends[-1])
    if not out.prompt_logprob_spans:
        return rows, len(rows) == num_rows  # increasing: as many as the batch's, all of them
    # a request's rows hold its positions from num_computed_tokens on
    first = {
        id(r): end - n - r.num_computed_tokens
        for (r, n), end in zip(scheduled, ends.tolist(), strict=True)
    }
    spans = [np.arange(s.start, s.stop) + first[id(r)] for r, s in out.prompt_logprob_spans]
    rows = np.concatenate([rows, *spans])
    return rows, np.array_equal(rows, np.arange(num_rows))
