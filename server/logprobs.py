"""Token log-probabilities in the two OpenAI shapes: legacy completions and chat."""

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from kvserve.engine.core.outputs import Logprob
from kvserve.engine.detokenizer import decode_text


def _text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    return decode_text(tokenizer, [token_id])


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: Sequence[int],
    logprobs: Sequence[Logprob | None],
    text_offset: int = 0,
) -> dict:
    """``{tokens, token_logprobs, top_logprobs, text_offset}``; a ``None`` entry (the first
    prompt token of an echo) has no log-probability."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, logprobs, strict=True):
        text = _text(tokenizer, token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        values.append(None if entry is None else entry.logprob)
        tops.append(None if entry is None else {_text(tokenizer, t): v for t, v in entry.top})
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_logprobs(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], logprobs: Sequence[Logprob]
) -> dict:
    def item(token_id: int, value: float) -> dict:
        text = _text(tokenizer, token_id)
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    content = [
        item(token_id, entry.logprob) | {"top_logprobs": [item(t, v) for t, v in entry.top]}
        for token_id, entry in zip(token_ids, logprobs, strict=True)
    ]
    return {"content": content}
