"""The engine's tokenizer: a checkpoint directory's own, or one built from a GGUF's metadata."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvserve.engine.models.gguf_checkpoint import gguf_file


def load_tokenizer(model: str, tokenizer: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``tokenizer`` (vLLM's ``--tokenizer``: a directory, or a GGUF file),
    else of ``model``. transformers builds a GGUF's (vocabulary, merges, special tokens, chat
    template) from the file's ``tokenizer.*`` metadata."""
    source = Path(tokenizer or model)
    gguf = gguf_file(source)
    if gguf is not None:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(source)
