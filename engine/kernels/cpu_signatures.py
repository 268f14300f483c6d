"""The C library's entry points (``cpu_library``) as their prototypes in ``csrc/`` declare
them: each one's parameters, named and typed, in order. tests/test_cpu_kernel_signatures.py
reads the prototypes and holds the two together. A call names every argument
(``cpu_library.run``), so a missing, unknown or mistyped one is an error that names it, and
the order is the prototype's by construction."""

import ctypes
import operator
from collections.abc import Callable
from typing import Any

Pointer, Int, Int64, Float = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float


class Signature:
    """A C entry point's parameters as (name, ctype) pairs in its prototype's order. A
    pointer parameter takes an address (``data_ptr()``) or None for NULL."""

    def __init__(self, kernel: str, /, **params: type) -> None:
        self.kernel = kernel
        self.params = tuple(params.items())
        self.names = tuple(params)
        self._take = _taker(self.names)

    def arguments(self, named: dict[str, Any]) -> tuple:
        """``named``'s values in the prototype's order; a TypeError naming every argument
        missing or unknown unless ``named`` names each parameter once."""
        if len(named) == len(self.names):
            try:
                return self._take(named)
            except KeyError:
                pass
        missing = [name for name in self.names if name not in named]
        unknown = [name for name in named if name not in self.names]
        raise TypeError(f"{self.kernel}(): missing {missing}, unknown {unknown}")

    def wrong_type(self, error: ctypes.ArgumentError) -> TypeError:
        """ctypes' error for an argument it cannot convert ("argument 3: ..."), naming it."""
        index = int(str(error).split(":")[0].split()[-1]) - 1
        name, ctype = self.params[index]
        return TypeError(f"{self.kernel}(): {name} takes a {ctype.__name__}: {error}")


def _taker(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple]:
    """A function of a dict: the values of ``names`` in order, as a tuple (KeyError for one
    missing). One C call (``operator.itemgetter``) for two names or more."""
    if len(names) >= 2:
        return operator.itemgetter(*names)
    return lambda named: tuple(named[name] for name in names)


SIGNATURES = {s.kernel: s for s in (
    Signature("best_isa"),
    Signature("paged_decode",
              q=Pointer, key_cache=Pointer, value_cache=Pointer, tables=Pointer,
              seq_lens=Pointer, out=Pointer, q_stride=Int64, num_seqs=Int, num_heads=Int,
              num_kv_heads=Int, head_dim=Int, block_size=Int, table_stride=Int, scale=Float,
              is_bf16=Int, bf16_dots=Int, kv_fp8=Int, k_scale=Float, v_scale=Float,
              sinks=Pointer, window=Int, softcap=Float, num_threads=Int, isa=Int),
    Signature("paged_prefill",
              q=Pointer, key_cache=Pointer, value_cache=Pointer, tables=Pointer,
              seq_lens=Pointer, query_starts=Pointer, query_lens=Pointer, out=Pointer,
              num_seqs=Int, num_heads=Int, num_kv_heads=Int, head_dim=Int, block_size=Int,
              table_stride=Int, scale=Float, is_bf16=Int, bf16_dots=Int, kv_fp8=Int,
              k_scale=Float, v_scale=Float, num_threads=Int, isa=Int),
    Signature("add_rms_norm",
              x=Pointer, residual=Pointer, weight=Pointer, out=Pointer, rows=Int, n=Int,
              heads=Int, x_token_stride=Int64, eps=Float, is_bf16=Int, num_threads=Int,
              isa=Int),
    Signature("silu_and_mul",
              gate_up=Pointer, out=Pointer, rows=Int, n=Int, is_bf16=Int, num_threads=Int,
              isa=Int),
    Signature("rope",
              q=Pointer, k=Pointer, positions=Pointer, cos_sin=Pointer, tokens=Int,
              q_heads=Int, k_heads=Int, head_dim=Int, q_stride=Int64, k_stride=Int64,
              max_positions=Int, is_bf16=Int, num_threads=Int, isa=Int),
    Signature("store_kv",
              key=Pointer, value=Pointer, key_cache=Pointer, value_cache=Pointer,
              slots=Pointer, tokens=Int, row_len=Int, key_stride=Int64, value_stride=Int64,
              is_bf16=Int, kv_fp8=Int, k_inv_scale=Float, v_inv_scale=Float, num_threads=Int),
    Signature("linear_tile_shape", isa=Int, rows=Pointer),
    Signature("linear_f32",
              x=Pointer, panels=Pointer, bias=Pointer, out=Pointer, m=Int, n=Int, k=Int,
              x_stride=Int64, num_threads=Int, isa=Int),
    Signature("linear_bf16",
              x=Pointer, panels=Pointer, bias=Pointer, out=Pointer, m=Int, n=Int, k=Int,
              x_stride=Int64, num_threads=Int, isa=Int),
    Signature("amx_usable"),
    Signature("linear_bf16_amx",
              x=Pointer, panels=Pointer, bias=Pointer, out=Pointer, m=Int, n=Int, k=Int,
              x_stride=Int64, num_threads=Int),
    Signature("dpbf16_usable"),
    Signature("linear_bf16_dp",
              x=Pointer, panels=Pointer, bias=Pointer, out=Pointer, m=Int, n=Int, k=Int,
              x_stride=Int64, num_threads=Int),
    Signature("row_argmax",
              x=Pointer, out=Pointer, rows=Int, cols=Int, row_stride=Int64, num_threads=Int,
              isa=Int),
)}  # fmt: skip
