"""GGUF files served directly: the metadata as the model's config and tokenizer, every
supported tensor type dequantized at load, greedy tokens exactly transformers' own GGUF
loader's, and a clear error for what is not supported."""

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from kvserve.engine.llm import LLM
from kvserve.engine.models.gguf_checkpoint import TYPES, GGUFTensors
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.tokenizer import load_tokenizer
from kvserve.server.cli import build_parser, engine_config

from checkpoints import TOOL_CHAT_TEMPLATE, build_checkpoint, trained_tokenizer
from gguf_checkpoints import write_gguf

EVERY_TYPE = tuple(t.name for t in TYPES)
PROMPTS = [[5, 77, 300, 12, 9, 100], [41, 42, 43], [200, 13, 7, 7, 310, 2, 90, 91, 400]]


def hf_greedy(path: Path, prompt: list[int], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


def engine_greedy(
    model: str, prompts: list[list[int]], max_tokens: int, ranks: int = 1
) -> list[list[int]]:
    llm = LLM(
        model, dtype="float32", num_kv_blocks=64, max_model_len=256, tensor_parallel_size=ranks
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


@pytest.mark.parametrize(
    ("family", "types", "overrides", "ranks"),
    [
        ("llama", EVERY_TYPE, {}, 1),
        ("qwen2", ("F16", "Q8_0"), {}, 1),
        ("qwen3", ("Q4_K", "BF16"), {"tie_word_embeddings": True}, 1),
        ("llama", ("Q4_1", "Q8_0"), {}, 2),
    ],
    ids=["llama-every-type", "qwen2-bias", "qwen3-qk-norm-tied", "llama-2-ranks"],
)
def test_greedy_tokens_are_transformers_own_gguf_loaders(tmp_path, family, types, overrides, ranks):
    path = write_gguf(tmp_path / "tiny.gguf", family, types, **overrides)
    expected = [hf_greedy(path, prompt, 12) for prompt in PROMPTS]
    assert len({tuple(tokens) for tokens in expected}) == len(PROMPTS)
    assert engine_greedy(str(path), PROMPTS, 12, ranks) == expected


def test_the_metadata_is_the_config_json_it_was_written_from(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", "qwen2", ("F16",))
    written = json.loads(path.with_suffix(".json").read_text())
    expected = dataclasses.replace(ModelConfig.from_dict(written), torch_dtype="float16")
    assert ModelConfig.from_dir(path) == expected
    assert ModelConfig.from_dir(tmp_path) == expected  # a directory holding one GGUF
    quantized = write_gguf(tmp_path / "q.gguf", "llama", ("Q4_1", "Q8_0"))
    assert ModelConfig.from_dir(quantized).torch_dtype is None  # served in float32


def test_the_tokenizer_comes_from_the_metadata_or_from_the_tokenizer_flag(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf")
    original = trained_tokenizer()
    tokenizer = load_tokenizer(str(path))
    text = "def wrap(text, width=70):\n    return TextWrapper(width).wrap(text)<|im_end|>"
    assert tokenizer(text).input_ids == original(text).input_ids
    messages = [{"role": "user", "content": "Wrap this."}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        original.apply_chat_template(messages, tokenize=False)
    )
    assert tokenizer.eos_token == "<|endoftext|>"
    other = build_checkpoint("llama", tmp_path / "hf", chat_template=TOOL_CHAT_TEMPLATE)
    assert load_tokenizer(str(path), str(other)).chat_template == TOOL_CHAT_TEMPLATE
    args = build_parser().parse_args(["serve", "--model", str(path), "--tokenizer", str(other)])
    assert (engine_config(args).model, engine_config(args).tokenizer) == (str(path), str(other))


def test_an_unsupported_architecture_is_named(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "gemma.gguf", "gemma2")
    writer.add_block_count(1)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file):
        write()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gemma2' .*llama, qwen2"):
        ModelConfig.from_dir(tmp_path / "gemma.gguf")


def test_an_unsupported_tensor_type_or_tensor_is_named(tmp_path):
    def one_tensor(name: str, qtype: gguf.GGMLQuantizationType, row_bytes: int) -> Path:
        path = tmp_path / f"{qtype.name}.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_head_count(4)
        writer.add_tensor(name, np.zeros((8, row_bytes), np.uint8), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    iq4 = one_tensor("token_embd.weight", gguf.GGMLQuantizationType.IQ4_NL, 18)
    with pytest.raises(ValueError, match=r"'token_embd.weight' .* is IQ4_NL, .*: F32, F16, BF16"):
        GGUFTensors(iq4)
    fused = one_tensor("blk.0.attn_qkv.weight", gguf.GGMLQuantizationType.Q8_0, 34)
    with pytest.raises(ValueError, match=r"unsupported GGUF tensor 'blk.0.attn_qkv.weight'"):
        GGUFTensors(fused)
    llama3 = one_tensor("rope_freqs.weight", gguf.GGMLQuantizationType.F32, 4)
    with pytest.raises(ValueError, match=r"frequency factors \(rope_freqs.weight, as Llama 3.1"):
        ModelConfig.from_dir(llama3)


def test_a_directory_of_several_ggufs_or_a_missing_file_is_an_error(tmp_path):
    write_gguf(tmp_path / "a.gguf")
    write_gguf(tmp_path / "b.gguf")
    with pytest.raises(ValueError, match=r"several GGUF files \(a.gguf, b.gguf\); name one"):
        ModelConfig.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no GGUF file .*missing\.gguf"):
        ModelConfig.from_dir(tmp_path / "missing.gguf")
