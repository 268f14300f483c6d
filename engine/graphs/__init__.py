"""Decode steps replayed without the Python that launches their kernels: CUDA graphs
(``cuda_graphs``) and recorded calls of the CPU kernels (``cpu_graphs``), both reading their
inputs from one ``StaticDecodeBatch`` (``static_batch``)."""
