"""Linear-attention (state-space) layers: the Gated DeltaNet of Qwen3-Next and Qwen3.5
(``gated_delta_net``), its two input-projection layouts (``projections``), the gated
RMSNorm (``gated_rms_norm``) and what a step tells them about its sequences' state slots
(``metadata``)."""
