"""Decode steps replayed from recorded kernel calls on a CPU, one recording per batch size.

A small decode step on a CPU spends about as long in the Python that calls its kernels as
in the kernels: ~10 calls a layer, each with its argument checks, allocations and pointer
marshalling (benchmarks/cpu-levers.md, lever 25). Where every op of the decoder layers is a
kernel of the project's library, a decode step of ``n`` sequences is the same list of calls
on the same addresses each time, once its inputs sit at fixed addresses: recorded while one
step of that size runs eagerly (``cpu_library.recording``), it is replayed without that
Python. Replaying reproduces the eager step bit for bit: the same kernels on the same
inputs in the same order.

A recording is kept only if nothing but the kernels computed during it: a torch op that
computes (a fallback path, a copy) would not be replayed, so a torch dispatch mode watches
the recorded step and any op other than an allocation or a view refuses that size for good
(it runs eagerly). The recording holds every tensor the step allocated, so its addresses
stay valid; recordings are kept, least recently used first out, within ``max_bytes``.
Batches run at their own size, unpadded: on a CPU padding rows cost as much as real ones.
"""

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kvserve.engine.graphs.static_batch import StaticDecodeBatch
from kvserve.engine.kernels import cpu_library
from kvserve.engine.models.decoder import DecoderLM, KVCache, StepMetadata

log = logging.getLogger(__name__)

aten = torch.ops.aten
ALLOCATIONS = frozenset({aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty})
# The most bytes of intermediate tensors the kept recordings hold together.
RECORDING_BYTES = 256 << 20


def use_cpu_graphs(device: torch.device, backend_name: str, enforce_eager: bool) -> bool:
    return device.type == "cpu" and backend_name == "cpu" and not enforce_eager


class _TorchOps(TorchDispatchMode):
    """The ops that computed while it was on (``computed``: any op but an allocation that
    wrote to an argument or returned a tensor outside its arguments' storage, or one
    without a storage, such as oneDNN's packed layout), and the tensors allocated
    (``allocated``: kept with the recording, so its addresses stay valid)."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: set[str] = set()
        self.allocated: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket in ALLOCATIONS:
            self.allocated.extend(_tensors(out))
        elif func._schema.is_mutable or _outside(_tensors(out), _tensors((args, kwargs))):
            self.computed.add(str(func))
        return out

    def bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.allocated)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _outside(outs: list[torch.Tensor], inputs: list[torch.Tensor]) -> bool:
    """Whether any of ``outs`` lies outside the storage of ``inputs``, or has none to compare."""
    stored = {_storage(t) for t in outs}
    return None in stored or not stored <= {_storage(t) for t in inputs}


def _storage(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage; None for a tensor without one (an opaque layout, as
    oneDNN's packed weights and mkldnn tensors have)."""
    if t.layout != torch.strided:
        return None
    return t.untyped_storage().data_ptr()


@dataclass
class Recording:
    """One decode step's kernel calls, the last layer's output (the residual stream is the
    input buffer, updated in place) and the tensors the step allocated, ``bytes`` in all.
    The calls pass the kernels the ``threads`` torch had when they were recorded."""

    calls: list[cpu_library.KernelCall]
    hidden: torch.Tensor
    allocated: list[torch.Tensor]
    bytes: int
    threads: int

    def replay(self) -> None:
        for call in self.calls:
            call()


class CPUDecodeGraphs:
    """Called like the model. Decode-only batches of up to ``max_size`` sequences, all rows
    out, replay the recording of their size (recorded by the first such step, and again by
    the first after torch's thread count changed); any other batch runs the model
    eagerly."""

    @torch.inference_mode()
    def __init__(
        self,
        model: DecoderLM,
        kv_caches: list[KVCache],
        max_size: int,
        max_blocks_per_seq: int,
        max_bytes: int = RECORDING_BYTES,
        layout: Sequence[int] = (),
    ) -> None:
        """``layout``: each layer's KV group or ``STATE`` (``StaticDecodeBatch``)."""
        self.model = model
        self.kv_caches = kv_caches
        self.max_bytes = max_bytes
        cpu = torch.device("cpu")
        self.static = StaticDecodeBatch(max_size, max_blocks_per_seq, cpu, layout)
        weight = model.embed_tokens.weight
        self.hidden = torch.empty(max_size, weight.shape[1], dtype=weight.dtype)
        self.recordings: OrderedDict[int, Recording] = OrderedDict()
        self.refused: set[int] = set()

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        first = meta[0] if isinstance(meta, list) else meta
        n = first.num_seqs
        if (
            input_ids.shape[0] != n  # not one token a sequence
            or n > self.hidden.shape[0]
            or n in self.refused
            or not self.static.fits(meta)
            or kv_caches is not self.kv_caches
            or out_rows is not None
            or not self.model.layers_after_embed
        ):
            return self.model(input_ids, positions, kv_caches, meta, out_rows)
        self.static.fill(input_ids, positions, meta, n)
        hidden = self.hidden[:n]
        hidden.copy_(self.model.embed(input_ids))
        recording = self.recordings.get(n)
        if recording is None or recording.threads != torch.get_num_threads():
            return self._record(n, hidden, meta)
        self.recordings.move_to_end(n)
        recording.replay()
        return hidden + recording.hidden

    def _record(self, n: int, hidden: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        """Runs the step eagerly on the static inputs, keeping its recording if it can be
        replayed and fits."""
        s = self.static
        static_meta = s.bound(meta)
        self.recordings.pop(n, None)
        threads = torch.get_num_threads()
        with cpu_library.recording() as calls, _TorchOps() as ops:
            out, residual = self.model.run_layers(
                hidden, s.positions[:n], self.kv_caches, static_meta
            )
        if ops.computed:
            self.refused.add(n)
            log.info(
                "decode steps of %d sequences run eagerly: torch computes %s",
                n,
                sorted(ops.computed),
            )
        else:
            self._keep(n, Recording(calls, out, ops.allocated, ops.bytes(), threads))
        return residual + out

    def _keep(self, n: int, recording: Recording) -> None:
        if recording.bytes > self.max_bytes:
            self.refused.add(n)
            return
        held = sum(r.bytes for r in self.recordings.values())
        while held + recording.bytes > self.max_bytes:
            held -= self.recordings.popitem(last=False)[1].bytes
        self.recordings[n] = recording
