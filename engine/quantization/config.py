"""A checkpoint's quantization, read from its config.json (``quantization_config``; ModelOpt
exports may carry it in ``hf_quant_config.json`` instead) or asked for with vLLM's
``--quantization``, as one ``QuantConfig``: the scheme of its linear layers and the modules
it leaves in 16 bits.

What is read, by ``quant_method`` (anything else is refused before a weight loads, naming it
and listing these):

* ``compressed-tensors`` (llm-compressor): ``float-quantized`` FP8 weights per tensor, per
  channel or per 128x128 block with dynamic per-token or static per-tensor FP8 activations;
  ``pack-quantized`` 4-bit integer weights in groups of 32, 64 or 128, symmetric or with
  zero points, act-order ``group`` or none, 16-bit activations.
* ``fp8`` (Hugging Face): block-wise ``weight_block_size`` with ``weight_scale_inv`` and
  dynamic activations (Qwen3-FP8, DeepSeek), or per-tensor ``weight_scale``.
* ``modelopt`` with ``quant_algo`` FP8: per-tensor weight and static activation scales.
* ``awq`` (GEMM packing, zero points) and ``gptq`` (symmetric or not, ``desc_act`` either way;
  checkpoint_format ``gptq`` or ``gptq_v2``): 4-bit weights in groups of 32, 64 or 128.
* ``mxfp4`` (gpt-oss): the MoE experts' weights in MXFP4 blocks and e8m0 scales
  (``kernels.mxfp4``), every linear layer 16-bit.
* ``--quantization fp8`` on a 16-bit checkpoint: per-channel FP8 weights made at load,
  dynamic per-token activations.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GROUP_SIZES = (32, 64, 128)
SUPPORTED = (
    "compressed-tensors (float-quantized FP8 W8A8; pack-quantized 4-bit W4A16), "
    "fp8 (block-wise or per-tensor), modelopt (FP8), awq (gemm), gptq (4-bit), "
    "mxfp4 (gpt-oss's experts), and --quantization fp8 on a 16-bit checkpoint"
)


@dataclass(frozen=True)
class Fp8Scheme:
    """FP8 (e4m3) weights and activations. ``weights``: ``tensor``, ``channel`` or ``block``
    (``block`` = (rows, columns) of one weight scale); ``activations``: ``dynamic`` (a scale
    per token, or per token and ``block[1]`` columns for block weights) or ``static`` (the
    checkpoint's per-tensor ``input_scale``). ``scale_name``: the checkpoint's name of the
    weight scale. ``at_load``: the weights are 16-bit in the checkpoint, quantized as they
    load."""

    weights: str
    activations: str
    block: tuple[int, int] | None = None
    scale_name: str = "weight_scale"
    at_load: bool = False

    def describe(self) -> str:
        if self.block is not None:
            granularity = f"{self.block[0]}x{self.block[1]} blocks"
        else:
            granularity = f"per-{self.weights}"
        return f"fp8 {granularity}, activations fp8 {self.activations}"


@dataclass(frozen=True)
class Int4Scheme:
    """4-bit integer weights, 16-bit activations: ``w = (q - zero) * scale`` per group of
    ``group_size`` input features. ``layout``: how the checkpoint packs them (``awq``,
    ``gptq``, ``pack-quantized``); ``symmetric``: every zero is 8; ``act_order``: a
    ``g_idx`` maps each input feature to its group (GPTQ ``desc_act``, compressed-tensors
    ``actorder: group``); ``zero_offset``: added to the stored zero points (1 for GPTQ's v1
    format, which stores zero - 1)."""

    layout: str
    group_size: int
    symmetric: bool
    act_order: bool = False
    zero_offset: int = 0

    @property
    def stores_zeros(self) -> bool:
        """Whether the checkpoint holds zero points: AWQ and GPTQ always do (8 when
        symmetric), compressed-tensors only for asymmetric weights."""
        return self.layout != "pack-quantized" or not self.symmetric

    def describe(self) -> str:
        zeros = "symmetric" if self.symmetric else "zero points"
        order = ", act-order" if self.act_order else ""
        return f"int4 groups of {self.group_size} ({zeros}{order}), activations 16-bit"


@dataclass(frozen=True)
class Mxfp4Scheme:
    """MXFP4 mixture-of-experts weights (gpt-oss): the experts' alone, every linear layer
    16-bit whatever ``modules_to_not_convert`` lists."""

    def describe(self) -> str:
        return "mxfp4 experts, linear layers 16-bit"


Scheme = Fp8Scheme | Int4Scheme | Mxfp4Scheme


@dataclass(frozen=True)
class QuantConfig:
    """``method``: the checkpoint's ``quant_method`` (or ``fp8`` asked for at load);
    ``ignore``: module names (or ``re:`` patterns) left unquantized."""

    method: str
    scheme: Scheme
    ignore: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.scheme.describe()} ({self.method})"

    def quantizes(self, names: list[str]) -> bool:
        """Whether the checkpoint modules ``names`` (the projections one fused layer holds)
        are quantized; a ValueError when only some of them are."""
        ignored = [any(_matches(rule, name) for rule in self.ignore) for name in names]
        if any(ignored) and not all(ignored):
            raise ValueError(
                f"{self.method} checkpoint quantizes some of {', '.join(names)} but not all; "
                "they run as one fused layer"
            )
        return not ignored[0]


def _matches(rule: str, name: str) -> bool:
    if rule.startswith("re:"):
        return re.fullmatch(rule[3:], name) is not None
    return name == rule or name.endswith("." + rule)


def read_quant_config(path: Path, raw: dict[str, Any], at_load: str | None) -> QuantConfig | None:
    """The quantization of the checkpoint at ``path`` (``raw``: its config.json), or the one
    ``at_load`` (``--quantization``) asks for; None for a 16-bit checkpoint served as is."""
    quant = raw.get("quantization_config")
    modelopt = path / "hf_quant_config.json"
    if quant is None and modelopt.is_file():
        quant = {"quant_method": "modelopt", **json.loads(modelopt.read_text())}
    if quant is None:
        if at_load is None:
            return None
        if at_load != "fp8":
            raise ValueError(f"unsupported --quantization {at_load!r}; supported: fp8")
        return QuantConfig("fp8", Fp8Scheme("channel", "dynamic", at_load=True))
    if not isinstance(quant, dict):
        raise ValueError("config.json's quantization_config is not an object")
    method = quant.get("quant_method")
    if at_load is not None and at_load != method:
        raise ValueError(
            f"--quantization {at_load} asks to quantize a checkpoint that is already "
            f"quantized ({method}); leave --quantization out"
        )
    readers = {
        "compressed-tensors": _compressed_tensors,
        "fp8": _hf_fp8,
        "modelopt": _modelopt,
        "awq": _awq,
        "gptq": _gptq,
        "mxfp4": _mxfp4,
    }
    if method not in readers:
        raise ValueError(
            f"unsupported quantization_config.quant_method {method!r}; supported: {SUPPORTED}"
        )
    return readers[method](quant)


def _refuse(method: str, what: str) -> ValueError:
    return ValueError(f"unsupported {method} checkpoint: {what}; supported: {SUPPORTED}")


def _group_size(method: str, size: Any) -> int:
    if size not in GROUP_SIZES:
        raise _refuse(method, f"group_size {size!r} (4-bit groups of {GROUP_SIZES} are)")
    return int(size)


def _compressed_tensors(quant: dict) -> QuantConfig:
    method = "compressed-tensors"
    groups = list((quant.get("config_groups") or {}).values())
    schemes = {json.dumps(_without_targets(g), sort_keys=True) for g in groups}
    if len(schemes) != 1:
        raise _refuse(method, f"{len(schemes)} different config_groups (one scheme is)")
    group = groups[0]
    if group.get("targets") not in (["Linear"], None):
        raise _refuse(method, f"config_groups targets {group.get('targets')!r} (Linear is)")
    weights = group.get("weights") or {}
    acts = group.get("input_activations")
    fmt = quant.get("format")
    ignore = tuple(quant.get("ignore") or ())
    kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if kind == "float" and bits == 8:
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _refuse(method, f"format {fmt!r} for FP8 weights (float-quantized is)")
        if strategy not in ("tensor", "channel", "block"):
            raise _refuse(method, f"FP8 weight strategy {strategy!r}")
        block = None
        if strategy == "block":
            structure = weights.get("block_structure")
            if not (isinstance(structure, list) and len(structure) == 2):
                raise _refuse(method, f"FP8 block_structure {structure!r}")
            block = (int(structure[0]), int(structure[1]))
        scheme = Fp8Scheme(strategy, _fp8_activations(acts, block), block)
        return QuantConfig(method, scheme, ignore)
    if kind == "int" and bits == 4:
        if fmt != "pack-quantized":
            raise _refuse(method, f"format {fmt!r} for 4-bit weights (pack-quantized is)")
        if acts is not None:
            raise _refuse(method, "4-bit weights with quantized activations (W4A16 is)")
        if strategy != "group":
            raise _refuse(method, f"4-bit weight strategy {strategy!r} (group is)")
        order = weights.get("actorder")
        if order not in (None, "group"):
            raise _refuse(method, f"actorder {order!r} (none or group is)")
        int4 = Int4Scheme(
            "pack-quantized",
            _group_size(method, weights.get("group_size")),
            symmetric=bool(weights.get("symmetric", True)),
            act_order=order == "group",
        )
        return QuantConfig(method, int4, ignore)
    raise _refuse(method, f"{bits}-bit {kind} weights")


def _without_targets(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "targets"}


def _fp8_activations(acts: dict | None, block: tuple[int, int] | None) -> str:
    method = "compressed-tensors"
    if acts is None:
        raise _refuse(method, "FP8 weights with 16-bit activations (W8A16)")
    if acts.get("type") != "float" or acts.get("num_bits") != 8:
        raise _refuse(method, f"{acts.get('num_bits')}-bit {acts.get('type')} activations")
    dynamic, strategy = acts.get("dynamic"), acts.get("strategy")
    if (
        dynamic is True
        and strategy in ("token", "group")
        and (strategy == "token") == (block is None)
    ):
        return "dynamic"
    if dynamic is False and strategy == "tensor" and block is None:
        return "static"
    raise _refuse(method, f"activation strategy {strategy!r} with dynamic {dynamic!r}")


def _hf_fp8(quant: dict) -> QuantConfig:
    ignore = tuple(quant.get("modules_to_not_convert") or ())
    scheme = quant.get("activation_scheme", "dynamic")
    block = quant.get("weight_block_size")
    if block is not None:
        if scheme != "dynamic":
            raise _refuse("fp8", f"activation_scheme {scheme!r} with weight_block_size")
        if not (isinstance(block, list) and len(block) == 2):
            raise _refuse("fp8", f"weight_block_size {block!r}")
        rows, cols = int(block[0]), int(block[1])
        return QuantConfig(
            "fp8", Fp8Scheme("block", "dynamic", (rows, cols), "weight_scale_inv"), ignore
        )
    if scheme not in ("dynamic", "static"):
        raise _refuse("fp8", f"activation_scheme {scheme!r}")
    return QuantConfig("fp8", Fp8Scheme("tensor", scheme), ignore)


def _modelopt(quant: dict) -> QuantConfig:
    inner = quant.get("quantization", quant)
    algo = inner.get("quant_algo")
    if algo != "FP8":
        raise _refuse("modelopt", f"quant_algo {algo!r} (FP8 is)")
    ignore = tuple(inner.get("exclude_modules") or ())
    return QuantConfig("modelopt", Fp8Scheme("tensor", "static"), ignore)


def _awq(quant: dict) -> QuantConfig:
    bits, version = quant.get("bits", quant.get("w_bit")), str(quant.get("version", "gemm"))
    if bits != 4:
        raise _refuse("awq", f"{bits}-bit weights")
    if version.lower() != "gemm":
        raise _refuse("awq", f"version {version!r} (gemm is)")
    if not quant.get("zero_point", True):
        raise _refuse("awq", "zero_point false")
    size = _group_size("awq", quant.get("group_size", quant.get("q_group_size")))
    ignore = tuple(quant.get("modules_to_not_convert") or ())
    return QuantConfig("awq", Int4Scheme("awq", size, symmetric=False), ignore)


def _gptq(quant: dict) -> QuantConfig:
    bits, fmt = quant.get("bits"), quant.get("checkpoint_format", "gptq")
    if bits != 4:
        raise _refuse("gptq", f"{bits}-bit weights")
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse("gptq", f"checkpoint_format {fmt!r} (gptq, gptq_v2 are)")
    scheme = Int4Scheme(
        "gptq",
        _group_size("gptq", quant.get("group_size")),
        symmetric=bool(quant.get("sym", True)),
        act_order=bool(quant.get("desc_act", False)),
        zero_offset=1 if fmt == "gptq" else 0,
    )
    ignore = tuple(quant.get("modules_to_not_convert") or ())
    return QuantConfig("gptq", scheme, ignore)


def _mxfp4(quant: dict) -> QuantConfig:
    return QuantConfig("mxfp4", Mxfp4Scheme(), tuple(quant.get("modules_to_not_convert") or ()))
