"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

A graph replays fixed kernels on fixed addresses, so a decode batch of ``n`` sequences is
copied into static input tensors sized for the next capture size ``>= n``; the padding
rows have slot ``-1`` (the Triton store kernel writes nothing for them) and a one-token
context, and their outputs are dropped. Only the Triton attention path can be captured:
the torch path reads host-side lengths that a graph would freeze.
"""

import bisect
from collections.abc import Sequence

import torch

from kvserve.engine.graphs.static_batch import StaticDecodeBatch
from kvserve.engine.models.decoder import DecoderLM, KVCache, StepMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 below ``max_num_seqs``, then ``max_num_seqs``."""
    small = [size for size in (1, 2, 4) if size < max_num_seqs]
    return [*small, *range(8, max_num_seqs, 8), max_num_seqs]


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``num_seqs``; None if none does."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


def use_cuda_graphs(device: torch.device, backend_name: str, enforce_eager: bool) -> bool:
    return device.type == "cuda" and backend_name == "triton" and not enforce_eager


class DecodeGraphs:
    """Called like the model. Decode-only batches of up to ``sizes[-1]`` sequences, all
    rows out, replay a captured graph; any other batch runs the model eagerly."""

    @torch.inference_mode()
    def __init__(
        self,
        model: DecoderLM,
        kv_caches: list[KVCache],
        sizes: list[int],
        max_blocks_per_seq: int,
        device: torch.device,
        layout: Sequence[int] = (),
    ) -> None:
        """``layout``: each layer's KV group (``StaticDecodeBatch``; no ``STATE``: a padding
        row would need a scratch state slot, which the plan does not keep)."""
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sizes
        self.static = StaticDecodeBatch(sizes[-1], max_blocks_per_seq, device, layout)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(sizes):  # the largest first: the others reuse its memory pool
            self._run(size)  # warm-up: compiles the Triton kernels, sets up cuBLAS
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._run(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(device)

    def _run(self, size: int) -> torch.Tensor:
        s = self.static
        return self.model(s.input_ids[:size], s.positions[:size], self.kv_caches, s.meta(size))

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n = (meta[0] if isinstance(meta, list) else meta).num_seqs
        size = padded_size(n, self.sizes) if input_ids.shape[0] == n else None
        fits = self.static.fits(meta)
        if size is None or not fits or kv_caches is not self.kv_caches or out_rows is not None:
            return self.model(input_ids, positions, kv_caches, meta, out_rows)
        self.static.fill(input_ids, positions, meta, size)
        self.graphs[size].replay()
        return self.outputs[size][:n]
