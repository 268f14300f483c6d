"""gpt-oss's harmony chat format for tiny checkpoints: its special tokens in a trained
tokenizer, a chat template in its shape, and its stop tokens."""

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from checkpoints import trained_tokenizer

HARMONY_TOKENS = (
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>",
    "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
)  # fmt: skip
RETURN, CALL = HARMONY_TOKENS.index("<|return|>"), HARMONY_TOKENS.index("<|call|>")
# gpt-oss's template, cut to what the tests use: each turn a message, the generation
# prompt "<|start|>assistant" (the model writes its channel next).
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def harmony_tokenizer() -> PreTrainedTokenizerFast:
    return trained_tokenizer(HARMONY_TOKENS, "<|return|>", HARMONY_TEMPLATE)


def use_harmony(path: Path) -> Path:
    """Give the checkpoint at ``path`` the harmony tokenizer and template."""
    harmony_tokenizer().save_pretrained(path)
    (path / "chat_template.jinja").write_text(HARMONY_TEMPLATE)
    return path
