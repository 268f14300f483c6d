"""Steps replayed from CUDA graphs, one graph per ``Bucket``: decode steps padded to a batch
size, and mixed steps (decodes with small prefill chunks) padded in tokens, sequences and
largest query.

Full graphs, not piecewise ones around attention: the Triton attention is one launch for
any mix of decodes and chunks, reads every length from the device, and a launch padded to a
bucket computes the real rows as the unpadded one does, so the whole forward is captured.
Only the Triton attention path can be captured: the torch path reads host-side lengths that
a graph would freeze.

Memory: every graph allocates from one pool, captured the most tokens first, so the pool
holds the largest step's intermediates once (for the Llama-3-8B shape at 512 tokens in
bf16, ≈ 60 MiB: the MLP's 512 x 28,672 gate-up rows the most), plus each graph's output
(``seqs`` x hidden, at most 2 MiB) and the static inputs (the decode and the mixed static
batch each have block tables of groups x ``max_num_seqs`` x ``max_blocks_per_seq`` int32,
0.5 MiB at 256 x 520). An estimate: unmeasured on a device. Each graph is captured after
one eager warm-up run of its shape.
"""

import torch

from kvserve.engine.graphs.graph_buckets import Bucket
from kvserve.engine.graphs.padded_steps import PaddedSteps
from kvserve.engine.models.decoder import KVCache, StepMetadata


def use_cuda_graphs(device: torch.device, backend_name: str, enforce_eager: bool) -> bool:
    return device.type == "cuda" and backend_name == "triton" and not enforce_eager


class CUDAGraphs:
    """Called like the model. A step that a bucket of ``steps`` holds replays that bucket's
    captured graph; any other step runs the model eagerly."""

    @torch.inference_mode()
    def __init__(self, steps: PaddedSteps) -> None:
        """Captures one graph of ``steps.run`` per bucket of ``steps`` (whose layout has no
        ``STATE``: a padding row would need a scratch state slot, which the plan does not
        keep)."""
        self.model = steps.model
        self.steps = steps
        self.graphs: dict[Bucket, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[Bucket, torch.Tensor] = {}
        pool = None
        for bucket in self.steps.buckets():
            self.steps.run(bucket)  # warm-up: compiles the Triton kernels, sets up cuBLAS
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = self.steps.run(bucket)
            pool = graph.pool()
            self.graphs[bucket] = graph
        torch.cuda.synchronize(steps.decode.input_ids.device)

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        bucket = self.steps.bucket(input_ids, kv_caches, meta, out_rows)
        if bucket is None:
            return self.model(input_ids, positions, kv_caches, meta, out_rows)
        rows = self.steps.fill(bucket, input_ids, positions, meta, out_rows)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:rows]
