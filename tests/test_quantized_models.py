"""Quantized checkpoints in their real on-disk formats (``quant_checkpoints``) load and serve:
against transformers running the weights each checkpoint means (its dequantized weights, in
float32), on one rank and on two.

The CPU computes with the weights dequantized at load, in float32 here, so 4-bit weight-only
checkpoints give transformers' greedy tokens (``assert_greedy_match``), and FP8 ones, whose
activations a CPU does not quantize, its logits within ``CPU_LOGIT_TOLERANCE``. The Triton
path (interpreted here) multiplies FP8 weights by FP8 activations: its logits, at every step
of 8 prompts, are within ``FP8_LOGIT_TOLERANCE`` of transformers' (following the tokens ours
chose), and its greedy token is transformers' wherever transformers' top-two logits are
further apart than that tolerance (closer ones may swap).
"""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve.engine.layers.attention.triton_backend import TritonAttention
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.llm import LLM
from kvserve.engine.models.loader import load_model
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.sampling_params import SamplingParams

from int4_packing import pack_nibbles
from quant_checkpoints import QuantizedCheckpoint, build_quant_source, write_quantized
from reference import assert_greedy_match, hf_greedy, hf_model
from sharded_steps import PROMPTS, on_two_ranks, run_steps

CPU_LOGIT_TOLERANCE = 2e-3
FP8_LOGIT_TOLERANCE = 0.75
"""e4m3 keeps 3 mantissa bits: each activation it quantizes is off by up to 1/16 of itself,
and the 8 linears of the two layers compound it. On these random models (logits within
about +-5, standard deviation 1.3) the error measured 0.61-0.66 at most over 32 rows."""
MAX_TOKENS = 12
PROMPT = [5, 17, 42, 99, 3, 250, 7]
FP8_PROMPTS = [
    [int(t) for t in torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n))]
    for n in range(3, 11)
]

WEIGHT_ONLY: dict[str, tuple[str, dict[str, Any]]] = {
    "awq-g32": ("awq", dict(group_size=32)),
    "awq-g64": ("awq", dict(group_size=64)),
    "awq-g128": ("awq", dict(group_size=128)),
    "gptq-g128-sym": ("gptq", dict(group_size=128, sym=True)),
    "gptq-g64-asym": ("gptq", dict(group_size=64, sym=False)),
    "gptq-g128-act-order": ("gptq", dict(group_size=128, sym=True, desc_act=True)),
    "gptq-g32-asym-act-order": ("gptq", dict(group_size=32, sym=False, desc_act=True)),
    "ct-int4-g128-sym": ("compressed-tensors-int4", dict(group_size=128, sym=True)),
    "ct-int4-g32-asym": ("compressed-tensors-int4", dict(group_size=32, sym=False)),
}
FP8: dict[str, tuple[str, dict[str, Any]]] = {
    "ct-fp8-tensor-static": ("compressed-tensors-fp8", dict(per_channel=False, dynamic=False)),
    "ct-fp8-channel-dynamic": ("compressed-tensors-fp8", dict(per_channel=True, dynamic=True)),
    "fp8-block": ("fp8", {}),
    "modelopt-fp8": ("modelopt-fp8", {}),
}
FORMATS = {**WEIGHT_ONLY, **FP8}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict[str, QuantizedCheckpoint]:
    """Every format's checkpoint of one bf16 Llama, with its float32 reference."""
    root = tmp_path_factory.mktemp("quantized")
    source = build_quant_source("llama", root / "source", seed=4)
    return {
        name: write_quantized(source, root / name, fmt, **options)
        for name, (fmt, options) in FORMATS.items()
    }


@pytest.fixture(scope="module")
def two_ranks(quantized, tmp_path_factory) -> list[dict[str, Any]]:
    paths = [checkpoint.path for checkpoint in quantized.values()]
    return on_two_ranks(run_steps, paths, tmp_path_factory.mktemp("two-ranks"))


def greedy(path: Path, **settings: Any) -> list[int]:
    llm = LLM(str(path), dtype="float32", **settings)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return list(llm.generate([PROMPT], params)[0].outputs[0].token_ids)


def reference_logits(reference: Path) -> torch.Tensor:
    """transformers' next-token logits after each of PROMPTS."""
    with torch.no_grad():
        return torch.stack(
            [hf_model(str(reference))(torch.tensor([p])).logits[0, -1] for p in PROMPTS]
        )


@pytest.mark.parametrize("name", WEIGHT_ONLY)
def test_weight_only_checkpoints_give_the_reference_tokens(quantized, name):
    checkpoint = quantized[name]
    expected = hf_greedy(str(checkpoint.reference), PROMPT, MAX_TOKENS)
    assert_greedy_match(str(checkpoint.reference), PROMPT, expected, greedy(checkpoint.path))


@pytest.mark.parametrize("name", FORMATS)
def test_logits_on_a_cpu_are_the_dequantized_models(quantized, name):
    checkpoint = quantized[name]
    ours = run_steps(checkpoint.path, TensorParallel())[0]
    torch.testing.assert_close(
        ours, reference_logits(checkpoint.reference), rtol=0, atol=CPU_LOGIT_TOLERANCE
    )


@pytest.mark.parametrize("name", FORMATS)
def test_two_ranks_give_the_tokens_and_logits_of_one(quantized, two_ranks, name):
    """Scales and packed weights shard with their weights: block scales along blocks,
    groups along groups (act-order: every group on each rank)."""
    one = run_steps(quantized[name].path, TensorParallel())
    for rank in two_ranks:
        got = rank[quantized[name].path.name]
        for step, (ours, theirs) in enumerate(zip(got, one, strict=True)):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4, msg=f"step {step}")
            assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def reference_steps(reference: Path, prompts: list[list[int]], ours: list[torch.Tensor]):
    """transformers' logits at each of ``run_steps``' steps, following the tokens ``ours``
    chose (rows: every prompt at step 0, then at step 1, ...)."""
    rows = []
    with torch.no_grad():
        for step in range(len(ours)):
            for i, prompt in enumerate(prompts):
                chosen = [int(logits[i].argmax()) for logits in ours[:step]]
                ids = torch.tensor([prompt + chosen])
                rows.append(hf_model(str(reference))(ids).logits[0, -1])
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["ct-fp8-tensor-static", "ct-fp8-channel-dynamic", "fp8-block"])
def test_fp8_arithmetic_on_the_triton_path_stays_near_the_reference(quantized, name):
    checkpoint = quantized[name]
    ours = run_steps(checkpoint.path, TensorParallel(), TritonAttention(), FP8_PROMPTS)
    expected = reference_steps(checkpoint.reference, FP8_PROMPTS, ours)
    got = torch.cat(ours)
    torch.testing.assert_close(got, expected, rtol=0, atol=FP8_LOGIT_TOLERANCE)
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > FP8_LOGIT_TOLERANCE
    assert clear.sum() >= 4  # the rule decides something on these prompts
    assert torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])


@pytest.mark.parametrize("name", ["awq-g64", "gptq-g32-asym-act-order", "ct-int4-g128-sym"])
def test_w4a16_on_the_triton_path_gives_the_reference_logits(quantized, name):
    checkpoint = quantized[name]
    ours = run_steps(checkpoint.path, TensorParallel(), TritonAttention())[0]
    torch.testing.assert_close(
        ours, reference_logits(checkpoint.reference), rtol=0, atol=CPU_LOGIT_TOLERANCE
    )


def test_the_plan_line_names_the_scheme(quantized):
    llm = LLM(str(quantized["ct-fp8-channel-dynamic"].path), dtype="float32")
    assert ", weights fp8 per-channel, activations fp8 dynamic (compressed-tensors), " in str(
        llm.engine.plan
    )


def test_quantization_fp8_quantizes_a_16_bit_checkpoint_as_it_loads(quantized, tmp_path):
    """Per-channel e4m3 weights (each row's largest magnitude at 448): transformers' tokens on
    those weights, computed here from the 16-bit ones."""
    source = quantized["fp8-block"].path.parent / "source"
    reference = tmp_path / "reference"
    shutil.copytree(source, reference)
    weights = load_file(reference / "model.safetensors")
    for name, weight in weights.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            scale = weight.float().abs().amax(dim=1, keepdim=True) / 448
            fp8 = (weight.float() / scale).to(torch.float8_e4m3fn)
            weights[name] = fp8.float() * scale
        else:
            weights[name] = weights[name].float()
    save_file(weights, reference / "model.safetensors", {"format": "pt"})
    expected = hf_greedy(str(reference), PROMPT, MAX_TOKENS)
    got = greedy(source, quantization="fp8")
    assert_greedy_match(str(reference), PROMPT, expected, got)
    assert greedy(source) != got  # the quantization changed the model


def test_a_scale_of_the_wrong_shape_is_named(quantized, tmp_path):
    path = tmp_path / "corrupt"
    shutil.copytree(quantized["fp8-block"].path, path)
    weights = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    weights[name] = weights[name][:, :-1].contiguous()
    save_file(weights, path / "model.safetensors", {"format": "pt"})
    with pytest.raises(ValueError) as err:
        LLM(str(path), dtype="float32")
    assert str(err.value).startswith(
        f"checkpoint tensor {name!r} (shape [2, 3]) does not fit "
        "layers.1.mlp.down_proj.weight_scale (this rank's part: [2, 4]): "
    )


def test_an_unsupported_scheme_is_refused_before_loading(quantized, tmp_path):
    path = tmp_path / "w8a8-int"
    shutil.copytree(quantized["ct-fp8-channel-dynamic"].path, path)
    config = json.loads((path / "config.json").read_text())
    weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
    weights.update(type="int")
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").unlink()  # nothing may be read
    with pytest.raises(ValueError) as err:
        LLM(str(path), dtype="float32")
    assert str(err.value).startswith(
        "unsupported compressed-tensors checkpoint: 8-bit int weights; supported: "
    )


def test_a_quantized_tensor_in_a_16_bit_checkpoint_says_why_it_is_unexpected(quantized, tmp_path):
    path = tmp_path / "no-config"
    shutil.copytree(quantized["ct-fp8-channel-dynamic"].path, path)
    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        LLM(str(path), dtype="float32")
    assert "it looks like a quantized checkpoint's tensor, but config.json has no " in str(
        err.value
    )


def test_quantized_layers_hold_their_compressed_form_on_the_triton_path(quantized):
    """4 bits a weight in int32 words plus a scale and zero per group; FP8 one byte."""
    shapes = {}
    for name in ("awq-g128", "fp8-block"):
        path = quantized[name].path
        model = load_model(
            path, ModelConfig.from_dir(path), TritonAttention(), 64, torch.float32,
            torch.device("cpu"),
        )  # fmt: skip
        layer = model.layers[0].mlp.down_proj
        shapes[name] = {n: (tuple(b.shape), b.dtype) for n, b in layer.named_buffers()}
    assert shapes == {
        "awq-g128": {
            "qweight": ((512 // 8, 256), torch.int32),
            "scales_t": ((4, 256), torch.float32),
            "zeros_t": ((4, 256), torch.float32),
            "g_index": ((512,), torch.int32),
        },
        "fp8-block": {
            "weight_fp8": ((256, 512), torch.float8_e4m3fn),
            "scale": ((2, 4), torch.float32),
        },
    }


def nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] → [R, 8C]: nibble i of word c at column 8c + i."""
    shifts = torch.arange(0, 32, 4)
    return ((words.long().unsqueeze(-1) >> shifts) & 0xF).flatten(1)


def rewrite(source: Path, path: Path, config: dict, convert) -> None:
    """``source``'s checkpoint at ``path`` with quantization_config ``config`` and every
    GPTQ projection's tensors (prefix → its tensors) replaced by ``convert``'s."""
    shutil.copytree(source, path)
    weights = load_file(path / "model.safetensors")
    prefixes = {n.removesuffix(".qweight") for n in weights if n.endswith(".qweight")}
    for prefix in prefixes:
        parts = {k.removeprefix(prefix + "."): weights.pop(k) for k in list(weights)
                 if k.startswith(prefix + ".")}  # fmt: skip
        weights.update({f"{prefix}.{k}": v for k, v in convert(parts).items()})
    save_file(weights, path / "model.safetensors", {"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "quantization_config": config}))


def test_gptq_v2_zero_points_are_stored_as_they_are(quantized, tmp_path):
    """checkpoint_format gptq_v2 stores the zero points themselves (v1: minus one): the v1
    checkpoint rewritten so means the same weights."""
    checkpoint = quantized["gptq-g64-asym"]
    config = json.loads((checkpoint.path / "config.json").read_text())["quantization_config"]

    def v2(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return parts | {"qzeros": pack_nibbles(nibbles(parts["qzeros"]) + 1)}

    rewrite(checkpoint.path, tmp_path / "v2", config | {"checkpoint_format": "gptq_v2"}, v2)
    ours = run_steps(tmp_path / "v2", TensorParallel())[0]
    torch.testing.assert_close(
        ours, reference_logits(checkpoint.reference), rtol=0, atol=CPU_LOGIT_TOLERANCE
    )


def test_compressed_tensors_act_order_groups_read_weight_g_idx(quantized, tmp_path):
    """A symmetric GPTQ act-order checkpoint written as compressed-tensors ``pack-quantized``
    with ``actorder: group`` (values signed plus 8 along the input features, scales [N, G],
    ``weight_g_idx``) means the same weights, on one rank and on two."""
    checkpoint = quantized["gptq-g128-act-order"]

    def packed(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        values = nibbles(parts["qweight"].T.contiguous()).T  # [K, N] unpacked along K
        return {
            "weight_packed": pack_nibbles(values.T.contiguous()),
            "weight_scale": parts["scales"].T.to(torch.bfloat16).contiguous(),
            "weight_g_idx": parts["g_idx"],
            "weight_shape": torch.tensor(list(values.T.shape)),
        }

    weights = dict(num_bits=4, type="int", strategy="group", group_size=128,
                   symmetric=True, dynamic=False, actorder="group")  # fmt: skip
    config = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }
    path = tmp_path / "ct-act-order"
    rewrite(checkpoint.path, path, config, packed)
    expected = reference_logits(checkpoint.reference)
    ours = run_steps(path, TensorParallel())[0]
    torch.testing.assert_close(ours, expected, rtol=0, atol=CPU_LOGIT_TOLERANCE)
    two = on_two_ranks(run_steps, [path], tmp_path)
    torch.testing.assert_close(two[0][path.name][0], ours, rtol=1e-4, atol=1e-4)
