"""The attention backend interface and the one place that picks an implementation."""

import logging
from abc import ABC, abstractmethod

import torch

from kvserve.engine.config import ATTENTION_BACKENDS
from kvserve.engine.layers.attention.fp8_kv import UNIT_SCALES, KVScales
from kvserve.engine.layers.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)


class AttentionBackend(ABC):
    """Paged attention over a flat batch.

    Caches are per layer, shaped ``[num_blocks, block_size, num_kv_heads,
    head_dim]``, in the model's dtype or as e4m3 (``fp8_kv``: stored ``x / scale``, read
    ``stored * scale`` with the layer's ``kv_scales``, which a 16-bit cache ignores). Every
    implementation must give the same results as the torch one (the reference), for any
    GQA ratio, ragged batch and block table.
    """

    name: str

    @abstractmethod
    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scales: KVScales = UNIT_SCALES,
    ) -> None:
        """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into their slots."""

    @abstractmethod
    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        *,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Causal attention of ``query`` ``[num_tokens, num_heads, head_dim]`` over each
        sequence's cached context; returns ``[num_tokens, num_heads, head_dim]``.

        A score is ``scale * q . k``; then, in this order:

        * ``softcap``: the score becomes ``softcap * tanh(score / softcap)`` (Gemma 2's
          ``attn_logit_softcapping``);
        * ``window``: a query at position ``p`` sees the keys at positions ``j`` with
          ``p - window < j <= p``: ``window`` tokens, itself included. This is
          ``transformers``' ``sliding_window_overlay`` (``kv_idx > q_idx - sliding_window``)
          that gemma2/gemma3/gemma4, gpt_oss and mistral all use with their config's
          ``sliding_window`` unchanged, so a model passes that number as it is;
        * ``sinks``: float32 ``[num_heads]``, one logit per head that joins each row's
          softmax denominator but carries no value:
          ``out = sum_j exp(s_j - m) v_j / (exp(sink - m) + sum_j exp(s_j - m))``
          (gpt-oss).

        With a window, a block of a sequence holding only positions before the window of
        its earliest query row in this step may have been freed, its block-table entry
        replaced by a placeholder: no backend reads it (each starts a sequence's keys at
        the block holding ``AttentionKind.first_key`` of that row).
        """


def select_backend(device: torch.device, choice: str = "auto") -> AttentionBackend:
    """Triton on CUDA; on a CPU the C decode kernel when it is built or a C compiler is
    there, else plain torch (the reference). ``choice`` overrides: ``torch``, ``cpu`` or
    ``triton``. Logs the one it picks."""
    backend = _backend(device, choice)
    log.info("attention backend: %s (%s, requested %s)", backend.name, device.type, choice)
    return backend


def _backend(device: torch.device, choice: str) -> AttentionBackend:
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {choice!r}")
    if choice == "auto":
        from kvserve.engine.kernels import cpu_library

        choice = "triton" if device.type == "cuda" else "cpu"
        if choice == "cpu" and not cpu_library.available():
            choice = "torch"
    if choice == "triton":
        from kvserve.engine.layers.attention.triton_backend import TritonAttention

        return TritonAttention()
    if choice == "cpu":
        from kvserve.engine.layers.attention.cpu_backend import CPUAttention

        if device.type != "cpu":
            raise ValueError("the cpu attention backend runs on the CPU only")
        return CPUAttention()
    from kvserve.engine.layers.attention.torch_backend import TorchAttention

    return TorchAttention()
