"""Checkpoints in every spelling load through the same path; the rest fail clearly."""

import json

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.engine.models.model_config import ModelConfig

from checkpoints import build_checkpoint
from reference import hf_greedy


def test_old_and_new_config_spellings_read_the_same(checkpoint):
    raw = json.loads((checkpoint("llama3-tied") / "config.json").read_text())
    new = ModelConfig.from_dict(raw)
    old_raw = {k: v for k, v in raw.items() if k not in ("rope_parameters", "dtype")}
    rope = dict(raw["rope_parameters"])
    old_raw["rope_theta"] = rope.pop("rope_theta")
    old_raw["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    old_raw["torch_dtype"] = raw["dtype"]
    assert ModelConfig.from_dict(old_raw) == new
    assert (new.rope.rope_type, new.rope.theta) == ("llama3", 500000.0)
    assert (new.torch_dtype, new.tie_word_embeddings) == ("float32", True)


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError) as err:
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})
    assert str(err.value) == (
        "unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM, "
        "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen2MoeForCausalLM, "
        "Qwen3MoeForCausalLM, MixtralForCausalLM, GptOssForCausalLM, Gemma3ForCausalLM, "
        "Gemma3ForConditionalGeneration, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, "
        "Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, "
        "Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration"
    )


def test_sharded_checkpoint_loads_and_matches(tmp_path):
    path = build_checkpoint("qwen2", tmp_path / "sharded", seed=3)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.save_pretrained(path, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    prompt = [5, 9, 33, 70, 12]
    llm = LLM(str(path), dtype="float32", num_kv_blocks=16)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(str(path), prompt, 8)


def test_missing_weight_is_named(tmp_path):
    path = build_checkpoint("llama", tmp_path / "broken")
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights for: layers\.1\.mlp\.gate_up_proj"):
        LLM(str(path), num_kv_blocks=4)


def test_engine_rejects_impossible_prompts_before_queueing(checkpoint):
    llm = LLM(str(checkpoint("llama")), max_model_len=64, num_kv_blocks=4, block_size=4)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match="the prompt has 64 tokens, which leaves no room"):
        llm.generate([list(range(3, 67))], greedy)
    with pytest.raises(ValueError, match="needs 5 KV blocks but the cache has only 4"):
        llm.generate([list(range(3, 20))], greedy)
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.generate([[]], greedy)
    with pytest.raises(ValueError, match=r"integers in \[0, 512\)"):
        llm.generate([[1, 512]], greedy)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.kv.pool.num_free_blocks == 4


def test_string_prompts_and_text_output(checkpoint):
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=64)
    tokenizer = llm.get_tokenizer()
    outs = llm.generate(["def wrap(text):", "import"], SamplingParams(temperature=0, max_tokens=5))
    for prompt, out in zip(["def wrap(text):", "import"], outs, strict=True):
        assert (out.prompt, out.prompt_token_ids) == (prompt, tokenizer.encode(prompt))
        completion = out.outputs[0]
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        assert completion.finish_reason in ("stop", "length")


def test_invalid_settings_name_the_setting(checkpoint):
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        LLM(str(checkpoint("llama")), max_num_seqs=0)
    with pytest.raises(ValueError, match="uni runs one rank, not tensor_parallel_size 2"):
        LLM(str(checkpoint("llama")), tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds the model's context of 512"):
        LLM(str(checkpoint("llama")), max_model_len=4096)
    with pytest.raises(ValueError, match="invalid top_p: 0"):
        SamplingParams(top_p=0)


def test_cpu_kv_cache_defaults_to_max_num_seqs_full_contexts(checkpoint):
    llm = LLM(str(checkpoint("llama")), max_num_seqs=3, block_size=16, max_model_len=100)
    assert llm.engine.plan.num_kv_blocks == 3 * 7  # ceil(100 / 16) blocks per full context
    budget = LLM(str(checkpoint("llama")), kv_cache_memory_gb=1 / 1024, block_size=16)
    # 2 layers x 2 (k, v) x 2 kv heads x 16 dims x 4 bytes = 512 bytes per token
    assert budget.engine.plan.num_kv_blocks == 2**20 // (512 * 16)


@pytest.mark.parametrize("bf16", ["this-cpu", "emulated"])
def test_bf16_linears_are_prepacked_and_give_the_same_tokens(bf16, checkpoint, monkeypatch):
    """Whichever kernel packs bf16 linears here (AMX, AVX-512-BF16, oneDNN, or, on a CPU
    whose bf16 is emulated, the panel kernel over bf16 panels), the tokens are those of
    torch's own bf16 linears. ``emulated`` takes this CPU's bf16 flags away."""
    from kvserve.engine import execution_plan
    from kvserve.engine.kernels import cpu_isa
    from kvserve.engine.layers.cpu_linear import amx_linear, dpbf16_linear, panel_linear
    from kvserve.engine.layers.cpu_linear.packed_linear import PackedLinear, can_pack

    if bf16 == "emulated":
        flags = cpu_isa.cpu_flags() - cpu_isa.NATIVE_BF16_FLAGS
        monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: flags)
        monkeypatch.setattr(amx_linear, "can_use", lambda dtype, device: False)
        monkeypatch.setattr(dpbf16_linear, "can_use", lambda dtype, device: False)
    if not can_pack(torch.bfloat16, torch.device("cpu")):
        pytest.skip("nothing packs bf16 linears here (no kernel library, no oneDNN bf16)")

    path = str(checkpoint("qwen2"))  # biased q/k/v projections too
    prompts = [[5, 9, 33, 70, 12, 8], [100, 200, 300]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    packed = LLM(path, dtype="bfloat16", num_kv_blocks=16)
    cpu = torch.device("cpu")
    expected = (  # the kernels of the project's own take the 64-wide shapes
        amx_linear.AmxLinear
        if amx_linear.can_use(torch.bfloat16, cpu)
        else dpbf16_linear.DpBf16Linear
        if dpbf16_linear.can_use(torch.bfloat16, cpu)
        else panel_linear.PanelLinear
        if panel_linear.can_use(torch.bfloat16, cpu)
        else PackedLinear
    )
    assert isinstance(packed.engine.runner.model.layers[0].self_attn.qkv_proj.kernel, expected)
    monkeypatch.setattr(execution_plan, "can_pack", lambda dtype, device: False)
    plain = LLM(path, dtype="bfloat16", num_kv_blocks=16)
    assert plain.engine.runner.model.lm_head.kernel is None  # torch's own F.linear
    assert [o.outputs[0].token_ids for o in packed.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in plain.generate(prompts, params)
    ]
