"""A step padded to a ``Bucket`` in static inputs, and the model run on them: the body that a
CUDA graph captures and replays (``cuda_graphs``), and that runs eagerly anywhere, so the
padded layout is tested on the CPU through the interpreted Triton kernels."""

from collections.abc import Sequence

import torch

from kvserve.engine.graphs.graph_buckets import Bucket, MixedBuckets, padded_size
from kvserve.engine.graphs.static_batch import StaticDecodeBatch, attention_part
from kvserve.engine.graphs.static_mixed_batch import StaticMixedBatch
from kvserve.engine.models.decoder import DecoderLM, KVCache, StepMetadata


class PaddedSteps:
    """Decode steps of up to ``decode_sizes[-1]`` sequences (padded to the next of
    ``decode_sizes``, ``StaticDecodeBatch``) and, with ``mixed``, steps of up to
    ``mixed.max_tokens`` tokens with prefill chunks (``StaticMixedBatch``), over
    ``kv_caches``. ``layout``: each layer's KV group (``StaticDecodeBatch``)."""

    def __init__(
        self,
        model: DecoderLM,
        kv_caches: list[KVCache],
        decode_sizes: list[int],
        mixed: MixedBuckets | None,
        max_blocks_per_seq: int,
        device: torch.device,
        layout: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.layout = tuple(layout)
        self.decode_sizes = decode_sizes
        self.decode = StaticDecodeBatch(decode_sizes[-1], max_blocks_per_seq, device, layout)
        self.mixed = mixed
        self.mixed_batch = (
            StaticMixedBatch(
                mixed.max_tokens, mixed.max_num_seqs, max_blocks_per_seq, device, layout
            )
            if mixed is not None
            else None
        )

    def buckets(self) -> list[Bucket]:
        """Every shape, the most tokens first (capture order: the others reuse its memory)."""
        decode = [Bucket(size, size, 1) for size in self.decode_sizes]
        mixed = self.mixed.all() if self.mixed is not None else []
        return sorted([*decode, *mixed], reverse=True)

    def bucket(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None,
    ) -> Bucket | None:
        """The shape a step is padded to; None: it runs unpadded, eagerly (more tokens,
        sequences or rows out than any shape holds, wider block tables, other caches)."""
        if kv_caches is not self.kv_caches:
            return None
        attention = attention_part(meta, self.layout)
        tokens, seqs = input_ids.shape[0], attention.num_seqs
        if attention.max_query_len == 1 and tokens == seqs and out_rows is None:
            size = padded_size(seqs, self.decode_sizes)
            if size is not None and self.decode.fits(meta):
                return Bucket(size, size, 1)
        if self.mixed is None or self.mixed_batch is None or not self.mixed_batch.fits(meta):
            return None
        rows = tokens if out_rows is None else out_rows.shape[0]
        return self.mixed.choose(tokens, max(seqs, rows), attention.max_query_len)

    def fill(
        self,
        bucket: Bucket,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        out_rows: torch.Tensor | None,
    ) -> int:
        """Copy a step into the static inputs of ``bucket`` (``bucket(...)``'s); returns how
        many of ``run``'s rows are the step's."""
        if bucket.max_query_len == 1:
            self.decode.fill(input_ids, positions, meta, bucket.seqs)
            return input_ids.shape[0]
        assert self.mixed_batch is not None
        return self.mixed_batch.fill(input_ids, positions, meta, out_rows, bucket)

    def run(self, bucket: Bucket) -> torch.Tensor:
        """The model on the static inputs of ``bucket``: ``bucket.seqs`` rows of hidden
        states, the step's first (``fill``'s count)."""
        if bucket.max_query_len == 1:
            d, size = self.decode, bucket.seqs
            return self.model(d.input_ids[:size], d.positions[:size], self.kv_caches, d.meta(size))
        m = self.mixed_batch
        assert m is not None
        return self.model(
            m.input_ids[: bucket.tokens],
            m.positions[: bucket.tokens],
            self.kv_caches,
            m.meta(bucket),
            m.rows[: bucket.seqs],
        )
