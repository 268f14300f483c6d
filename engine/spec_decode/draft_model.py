"""A draft model: a smaller checkpoint of the target's tokenizer that guesses its next tokens.

It runs on rank 0 next to the target, in the target's runner, with KV tensors of its own: one
pair per layer of the target's block count and block size, addressed through the target's
block tables and slots. So one block id holds a position's keys and values of both models,
and the block pool counts both (``draft_kv.draft_kv_block_bytes``).
Every step the target computes, the draft computes too, over the same tokens at the same slots
(``forward_step``); wherever the target's KV is valid, the draft's is (a prefix-cached block
was computed by both, a rejected draft's slot is rewritten by both). ``propose`` then decodes
greedily from each request's last token, writing the draft's KV at the positions the next
verification step writes the target's (the proposer gives the request those blocks first).
Greedy drafts are point masses, so the verifier's rule keeps the target's distribution.
"""

import numpy as np
import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device
from kvserve.engine.execution_plan import ExecutionPlan
from kvserve.engine.kernels.row_argmax import row_argmax
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.models.decoder import StepMetadata
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.spec_decode.draft_kv import draft_config


class DraftModel:
    """The draft checkpoint loaded for ``plan``'s device and dtype, with its KV tensors
    (``allocate_kv``)."""

    def __init__(self, config: EngineConfig, target: ModelConfig, plan: ExecutionPlan) -> None:
        cfg = draft_config(config)
        assert cfg is not None
        if cfg.vocab_size != target.vocab_size:
            raise ValueError(
                f"speculative_config.model has a vocabulary of {cfg.vocab_size} tokens, the "
                f"target {target.vocab_size}: a draft model shares the target's tokenizer"
            )
        if cfg.linear_layers or cfg.layer_windows:
            raise ValueError(
                "speculative_config.model: a draft model must use full attention in every layer"
            )
        spec = config.speculative_config
        assert spec is not None and spec.model is not None
        self.block_size = plan.block_size
        self.device = plan.device
        self.model = load_model(
            spec.model,
            cfg,
            plan.backend,
            plan.max_model_len,
            plan.dtype,
            plan.device,
            packed=plan.packed_linears,
        )
        self.cfg, self.kv_dtype = cfg, plan.kv_cache_dtype
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._first_row = torch.zeros(1, dtype=torch.long, device=plan.device)

    def allocate_kv(self, num_blocks: int) -> None:
        """The draft's KV tensors, one pair per layer of ``num_blocks`` blocks: made after
        the target's KV is sized, whose measure of free device memory counts the draft's
        weights already (they are loaded first)."""
        cfg = self.cfg
        shape = (num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
            )
            for _ in range(cfg.num_layers)
        ]

    def forward_step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMetadata
    ) -> None:
        """Compute the draft's KV for a step's tokens (the target's step inputs); of the
        last layer's rows, only the first runs past attention (none is read)."""
        self.model(input_ids, positions, self.kv_caches, meta, self._first_row)

    @torch.inference_mode()
    def propose(
        self,
        last_tokens: list[int],
        positions: list[int],
        block_tables: list[list[int]],
        counts: list[int],
    ) -> list[list[int]]:
        """For each request, ``counts[i]`` greedy tokens after ``last_tokens[i]`` (at
        ``positions[i]``, its KV not yet computed), one batched decode step per draft;
        ``block_tables[i]`` covers the positions written: ``positions[i]`` onwards, one
        less than ``counts[i]``."""
        drafts: list[list[int]] = [[] for _ in counts]
        alive = [i for i, count in enumerate(counts) if count > 0]
        tokens, at = list(last_tokens), list(positions)
        bs, dev = self.block_size, self.device
        while alive:
            width = max(len(block_tables[i]) for i in alive)
            tables = np.zeros((len(alive), width), dtype=np.int32)
            slots = []
            for row, i in enumerate(alive):
                tables[row, : len(block_tables[i])] = block_tables[i]
                slots.append(block_tables[i][at[i] // bs] * bs + at[i] % bs)
            seq_lens = [at[i] + 1 for i in alive]
            meta = AttentionMetadata(
                slot_mapping=to_device(slots, dev),
                query_start_loc=to_device(list(range(len(alive) + 1)), dev, torch.int32),
                seq_lens=to_device(seq_lens, dev, torch.int32),
                block_tables=to_device(tables, dev),
                query_lens_host=[1] * len(alive),
                seq_lens_host=seq_lens,
                max_query_len=1,
                max_seq_len=max(seq_lens),
            )
            ids = to_device([tokens[i] for i in alive], dev, torch.long)
            hidden = self.model(ids, to_device([at[i] for i in alive], dev), self.kv_caches, meta)
            chosen = row_argmax(self.model.logits(hidden)).tolist()
            for row, i in enumerate(alive):
                drafts[i].append(chosen[row])
                tokens[i], at[i] = chosen[row], at[i] + 1
            alive = [i for i in alive if len(drafts[i]) < counts[i]]
        return drafts


class DraftModelProposer:
    """Gives each request the blocks the draft writes into (its last token's position and
    its drafts' but the last: the next verification step's blocks, taken now), then has the
    draft decode; a request whose blocks cannot be had gets no drafts."""

    def __init__(self, draft: DraftModel, kv: KVCacheManager, k: int) -> None:
        self.draft, self.kv, self.k = draft, kv, k

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        counts = []
        for request, limit in zip(requests, limits, strict=True):
            count = min(self.k, limit)
            counts.append(count if count > 0 and self.kv.allocate_slots(request, count) else 0)
        return self.draft.propose(
            [r.all_token_ids[-1] for r in requests],
            [r.num_tokens - 1 for r in requests],
            [r.block_ids for r in requests],
            counts,
        )
