"""The incremental detokenizer against a byte-level BPE tokenizer trained here."""

import itertools

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from kvserve.engine.detokenizer import Detokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 20,
    "hello world, hello there, stop here and there. " * 20,
    "数据 模型 服务 " * 5,
]
TEXTS = [
    "hello world, the lazy fox",
    "数据服务 and 模型 🚀🎉 done",
    "naïve café — 😀 ok",
    "🇫🇷👩‍👩‍👧 families",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _stream(detok: Detokenizer, ids: list[int]) -> list[str]:
    """Feed ``ids`` one at a time; return the visible text (the pieces taken so far, joined)
    after each."""
    seen, text = [], ""
    for token_id in ids:
        if detok.update([token_id]) is not None:
            break
        text += detok.take(finished=False)
        seen.append(text)
    detok.flush()
    seen.append(text + detok.take(finished=True))
    return seen


@pytest.mark.parametrize("text", TEXTS)
def test_never_a_half_character_and_ends_with_the_whole_text(tokenizer, text):
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces) or text.isascii()  # tokens do split characters
    seen = _stream(Detokenizer(tokenizer), ids)
    assert seen[-1] == text == tokenizer.decode(ids)
    for earlier, later in itertools.pairwise(seen):
        assert "\ufffd" not in earlier
        assert later.startswith(earlier)


def test_stop_string_spanning_tokens_is_cut_from_the_text(tokenizer):
    text = "hello world, stop here and there"
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert not any("op he" in p for p in pieces)  # the stop string spans two tokens
    detok = Detokenizer(tokenizer, stop=["zzz", "op he"])
    seen = _stream(detok, ids)
    assert detok.stop_reason == "op he"
    assert seen[-1] == "hello world, st"
    assert all(s == seen[-1][: len(s)] for s in seen)  # no streamed text is ever taken back


def test_first_of_several_stop_strings_wins(tokenizer):
    detok = Detokenizer(tokenizer, stop=["there", "here"])
    seen = _stream(detok, tokenizer.encode("go there now"))
    assert detok.stop_reason == "there"
    assert seen[-1] == "go "


def test_stop_string_after_a_multibyte_character(tokenizer):
    detok = Detokenizer(tokenizer, stop=["🚀"])
    seen = _stream(detok, tokenizer.encode("数据服务 🚀 after"))
    assert detok.stop_reason == "🚀"
    assert seen[-1] == "数据服务 "


def test_hold_back_keeps_a_possible_stop_prefix_until_finished(tokenizer):
    detok = Detokenizer(tokenizer, stop=["lazy dog"])
    ids = tokenizer.encode("the lazy fox")
    for token_id in ids:
        assert detok.update([token_id]) is None
    held = detok.take(finished=False)
    assert held == "the lazy fox"[: len("the lazy fox") - 7]
    assert held + detok.take(finished=True) == "the lazy fox"


def test_special_tokens_are_skipped_and_prompt_gives_left_context(tokenizer):
    eos = tokenizer.eos_token_id
    prompt = tokenizer.encode("hello")
    ids = [*tokenizer.encode(" world"), eos]
    detok = Detokenizer(tokenizer, prompt_token_ids=prompt)
    detok.update(ids)
    assert detok.take(finished=True) == " world"
    raw = Detokenizer(tokenizer, skip_special_tokens=False)
    raw.update(ids)
    assert raw.take(finished=True) == " world<|endoftext|>"
