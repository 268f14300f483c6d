"""Steps replayed without the Python that launches their kernels: CUDA graphs
(``cuda_graphs``: decode steps and mixed steps with small prefill chunks, padded to a
``graph_buckets`` shape by ``padded_steps``) and recorded calls of the CPU kernels
(``cpu_graphs``: decode steps), reading their inputs from a ``StaticDecodeBatch``
(``static_batch``) or, for a mixed step, a ``StaticMixedBatch`` (``static_mixed_batch``)."""
