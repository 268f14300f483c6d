"""benchmarks/gguf_export.py: a GGUF written out as a Hugging Face directory (what
spec_decode.py serves to vLLM, which reads no GGUF) is the same model: transformers loads
it with every weight and generates exactly what transformers' own GGUF loader does, and its
tokenizer is the GGUF's."""

import importlib
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvserve.engine.tokenizer import load_tokenizer

from gguf_checkpoints import write_gguf

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [5, 77, 300, 12, 9, 100]


@pytest.fixture
def gguf_export(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("gguf_export")
    sys.modules.pop("gguf_export", None)


def greedy(model: AutoModelForCausalLM) -> list[int]:
    with torch.no_grad():
        out = model.eval().generate(
            torch.tensor([PROMPT]),
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
        )
    return out[0, len(PROMPT) :].tolist()


def test_the_exported_directory_generates_as_the_gguf_does(tmp_path, gguf_export):
    gguf = write_gguf(tmp_path / "m.gguf", "llama", ("Q4_1", "Q8_0"))
    directory = gguf_export.export(gguf, tmp_path / "hf")
    from_gguf = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    )
    exported, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    assert greedy(exported) == greedy(from_gguf)
    text = "hello world, the tokenizer of the file"
    assert AutoTokenizer.from_pretrained(directory).encode(text) == load_tokenizer(
        str(gguf)
    ).encode(text)
    with pytest.raises(FileExistsError):
        gguf_export.export(gguf, directory)  # never over a directory already there
