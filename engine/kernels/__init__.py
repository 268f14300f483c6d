"""The ground floor: everything compiled or JIT-ed. The C library of CPU kernels and its
bindings (``cpu_library``, sources in ``csrc/``), what this CPU can do (``cpu_isa``), the Triton
kernels (``triton_attention``, ``triton_fused``) and the sampler's ``row_argmax``. Nothing
here imports from above it (tests/test_kernels_floor.py)."""
