"""The embedded demo checkpoint (server/default_model): a standard Llama directory that
transformers loads offline, small enough to ship, whose greedy replies are English words."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from kvserve.server.cli import DEFAULT_MODEL

MAX_BYTES = 8 * 1024 * 1024
COMPLETION_PROMPTS = ["The file object", "Return the number of", "This module provides"]
CHAT_QUESTIONS = ["What does the open function do?", "Explain the for statement."]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(
        DEFAULT_MODEL, local_files_only=True, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def words(tokenizer) -> set[str]:
    """The whole alphabetic words the BPE learned as single tokens (the frequent ones)."""
    return {
        token.removeprefix("Ġ").lower()
        for token in tokenizer.get_vocab()
        if token.removeprefix("Ġ").isalpha()
    }


def word_like(text: str, words: set[str]) -> bool:
    """True when `text` reads as words: at least 70% of its whitespace-separated words are
    alphabetic vocabulary words (trailing punctuation aside), and at least 5 distinct ones
    (a model stuck on one token does not pass)."""
    found = text.split()
    known = [w for w in found if w.rstrip(".,:;").lower() in words]
    return len(known) >= 0.7 * len(found) and len({w.lower() for w in known}) >= 5


def greedy(model, input_ids: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, input_ids.shape[1] :].tolist()


def completion(model, tokenizer, prompt: str) -> str:
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    return tokenizer.decode(greedy(model, ids, 20), skip_special_tokens=True)


def test_directory_is_a_small_standard_llama_checkpoint():
    files = {path.name: path.stat().st_size for path in DEFAULT_MODEL.iterdir()}
    assert set(files) == {
        "README.md",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert sum(files.values()) <= MAX_BYTES
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == 0
    generation = json.loads((DEFAULT_MODEL / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [0, 2]


def test_special_tokens_and_chatml_template(tokenizer):
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        0,
        1,
        2,
    ]
    assert tokenizer.eos_token == "<|endoftext|>"
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("prompt", COMPLETION_PROMPTS)
def test_greedy_completion_is_word_like(model, tokenizer, words, prompt):
    text = completion(model, tokenizer, prompt)
    assert word_like(text, words), text


def test_greedy_completion_of_the_shipped_weights(model, tokenizer):
    """Pins the weights in the repository: rebuilding the model changes this text."""
    assert completion(model, tokenizer, "Return the number of") == (
        " bytes of the file.\n\nThe name is a string, the file is a file object."
    )


@pytest.mark.parametrize("seed", range(10))
def test_word_check_rejects_random_tokens(tokenizer, words, seed):
    ids = torch.randint(3, len(tokenizer), (20,), generator=torch.Generator().manual_seed(seed))
    text = tokenizer.decode(ids.tolist())
    assert not word_like(text, words), text


def test_word_check_rejects_an_untrained_model_of_the_same_shape(model, tokenizer, words):
    """Untrained greedy output repeats one token: the distinct-word floor rejects it."""
    for seed in range(3):
        torch.manual_seed(seed)
        untrained = LlamaForCausalLM(model.config).eval()
        for prompt in COMPLETION_PROMPTS:
            text = completion(untrained, tokenizer, prompt)
            assert not word_like(text, words), text


@pytest.mark.parametrize("question", CHAT_QUESTIONS)
def test_chat_reply_is_word_like_and_ends_the_turn(model, tokenizer, words, question):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    reply = greedy(model, ids, 80)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in reply
    text = tokenizer.decode(reply[: reply.index(im_end)])
    assert word_like(text, words), text
