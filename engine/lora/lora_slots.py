"""The adapters resident on the device: ``max_loras`` slots in every LoRA layer of one
rank's model, filled least-recently-used.

``wrap`` puts a ``LoRALinear`` over each of a decoder layer's q/k/v, o, gate/up and down
projections (a mixture-of-experts layer's MLP is left alone: adapters targeting it are
refused when they load). A model built with LoRA off is never wrapped: its forward is
exactly the plain one.
"""

from collections import OrderedDict
from typing import cast

import numpy as np
import torch

from kvserve.engine.kernels.lora_segments import lora_segments
from kvserve.engine.layers.linear import LinearBase, RowParallelLinear
from kvserve.engine.lora.lora_linear import LoRABatch, LoRALinear
from kvserve.engine.lora.peft_adapter import LoRAAdapter
from kvserve.engine.models.decoder import MLP, DecoderLayer, DecoderLM

Part = tuple[str, int]
"""(PEFT module name, the part's first output feature in the unsharded projection)."""


class LoRASlots:
    """Slot ``s`` of every layer holds the same adapter; ``resident`` maps an adapter's
    serial → its slot, least recently used first; ``loads`` counts slot fills;
    ``use_kernels``: the layers run the Triton kernels (on a GPU; on a CPU only under
    Triton's interpreter, as tests run them), else the torch path."""

    def __init__(
        self, model: DecoderLM, max_loras: int, max_rank: int, device: torch.device
    ) -> None:
        self.max_loras = max_loras
        self.batch = LoRABatch()
        self.resident: OrderedDict[int, int] = OrderedDict()
        self.loads = 0
        self.device = device
        self.use_kernels = device.type == "cuda"
        self.layers: list[tuple[int, LoRALinear, list[Part], bool]] = []
        tp = model.tp
        for index, module in enumerate(model.layers):
            layer = cast(DecoderLayer, module)
            attn = layer.self_attn
            qkv = attn.qkv_proj
            kv_source = qkv.kv_head_start * qkv.head_dim
            parts = [("q_proj", tp.rank * qkv.q_size), ("k_proj", kv_source), ("v_proj", kv_source)]
            sizes = [qkv.q_size, qkv.kv_size, qkv.kv_size]
            count = len(qkv.parts)  # the projections it has: q, k and v, q and k, or q
            wrapped = self._wrap(index, qkv, parts[:count], sizes[:count], max_rank)
            setattr(attn, "qkv_proj", wrapped)  # noqa: B010 - nn.Module registers it
            o_proj = cast(LinearBase, attn.o_proj)
            wrapped = self._wrap(index, o_proj, [("o_proj", 0)], [o_proj.out_features], max_rank)
            setattr(attn, "o_proj", wrapped)  # noqa: B010
            if isinstance(layer.mlp, MLP):
                mlp = layer.mlp
                mlp.chunk_rows = False  # a LoRA batch's row groups span the whole batch
                gate_up = mlp.gate_up_proj
                width = gate_up.parts[0]
                wrapped = self._wrap(
                    index,
                    gate_up,
                    [("gate_proj", tp.rank * width), ("up_proj", tp.rank * width)],
                    gate_up.parts,
                    max_rank,
                )
                setattr(mlp, "gate_up_proj", wrapped)  # noqa: B010
                down = cast(LinearBase, mlp.down_proj)
                wrapped = self._wrap(index, down, [("down_proj", 0)], [down.out_features], max_rank)
                setattr(mlp, "down_proj", wrapped)  # noqa: B010

    def _wrap(
        self, index: int, base: LinearBase, parts: list[Part], sizes: list[int], max_rank: int
    ) -> LoRALinear:
        """``base`` of layer ``index`` wrapped; ``parts`` and their ``sizes`` on this rank."""
        offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        wrapped = LoRALinear(
            base,
            list(zip(offsets, sizes, strict=True)),
            self.max_loras,
            max_rank,
            self.batch,
            self.device,
        )
        self.layers.append((index, wrapped, parts, isinstance(base, RowParallelLinear)))
        return wrapped

    def assign(
        self, adapters: list[LoRAAdapter]
    ) -> tuple[dict[int, int], list[tuple[int, LoRAAdapter]]]:
        """The slot of each of a step's adapters (at most ``max_loras``) by serial, and the
        (slot, adapter) fills that make it so: those not resident go to free slots or to
        those of the least recently used others. Rank 0 decides (this bookkeeping); every
        rank then ``load``s the fills into its own shards before the step runs."""
        if len(adapters) > self.max_loras:
            raise ValueError(f"{len(adapters)} adapters in one step, max_loras is {self.max_loras}")
        wanted = {a.serial for a in adapters}
        fills = []
        for adapter in adapters:
            if adapter.serial in self.resident:
                self.resident.move_to_end(adapter.serial)
                continue
            taken = set(self.resident.values())
            free = [s for s in range(self.max_loras) if s not in taken]
            if free:
                slot = free[0]
            else:
                victim = next(n for n in self.resident if n not in wanted)
                slot = self.resident.pop(victim)
            fills.append((slot, adapter))
            self.resident[adapter.serial] = slot
        return {a.serial: self.resident[a.serial] for a in adapters}, fills

    def set_rows(self, row_slots: np.ndarray | torch.Tensor | None) -> None:
        """Group the step's rows by slot (``row_slots[i]``: row i's slot, -1 for the base
        model; a worker gets them as a tensor); None: no row runs an adapter. For the Triton
        kernels (``use_kernels``) they go as ``LoRASegments``."""
        self.batch.groups, self.batch.segments = [], None
        if row_slots is None:
            return
        row_slots = np.asarray(row_slots)
        if self.use_kernels:
            self.batch.segments = lora_segments(row_slots, self.device)
            return
        present = np.unique(row_slots)
        if len(present) == 1 and present[0] >= 0:
            self.batch.groups.append((int(present[0]), None))
            return
        for slot in present:
            if slot >= 0:
                rows = torch.from_numpy(np.flatnonzero(row_slots == slot)).to(self.device)
                self.batch.groups.append((int(slot), rows))

    def load(self, slot: int, adapter: LoRAAdapter) -> None:
        """Fill ``slot`` with this rank's shards of ``adapter``."""
        self.loads += 1
        with torch.no_grad():
            for index, layer, parts, row_parallel in self.layers:
                pairs: list[tuple[torch.Tensor, torch.Tensor] | None] = []
                for (module, source), (_, size) in zip(parts, layer.parts, strict=True):
                    pair = adapter.weights.get((index, module))
                    if pair is None:
                        pairs.append(None)
                        continue
                    a, b = pair
                    if row_parallel:
                        width = layer.base.in_features
                        a = a[:, layer.base.tp.rank * width : (layer.base.tp.rank + 1) * width]
                    else:
                        b = b[source : source + size]
                    pairs.append((a, b))
                layer.set_slot(slot, pairs)
