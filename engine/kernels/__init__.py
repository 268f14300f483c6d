"""The ground floor: everything compiled or JIT-ed. The C library of CPU kernels
(``cpu_library``; its sources in ``csrc/``, each entry point's named parameters in
``cpu_signatures``), what this CPU can do (``cpu_isa``), the Triton kernels
(``triton_attention``, ``triton_fused``, the MoE experts' ``triton_fused_moe`` with its
routing ``moe_align``, tiles ``fused_moe_config`` and weight format ``mxfp4``, the
linear-attention layers' ``triton_delta_rule`` and ``triton_causal_conv1d``, whose torch
paths are ``delta_rule_torch`` and ``causal_conv1d_torch`` over ``slot_states``, the batched
LoRA shrink and expand ``triton_lora`` over a step's rows grouped by ``lora_segments``) and
the sampler's ``row_argmax``. Nothing here imports from above it (tests/test_kernels_floor.py)."""
