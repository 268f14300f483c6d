"""Incremental detokenization of one request's output, with stop strings.

Text grows token by token without ever emitting half a character: a byte-level token
may end inside a multi-byte UTF-8 sequence, so new text is only taken once the decode
of the recent window no longer ends in U+FFFD. Stop strings are searched across token
boundaries; the text returned is what precedes the first stop string. While stop
strings are set, the last ``len(longest stop) - 1`` characters are held back until the
request finishes, so that streamed deltas never contain text a later stop cuts away and
their concatenation equals the final text.
"""

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded as left context of the first output tokens, so that tokenizers
# whose decoding depends on what precedes (leading spaces) give the same text as a whole.
_CONTEXT_TOKENS = 5


class Detokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._skip_special = skip_special_tokens
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = len(self._token_ids)  # tokens before this are already in ``_text``
        self._text = ""
        self.stop_reason: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )

    def update(self, new_token_ids: Sequence[int], check_stop: bool = True) -> str | None:
        """Add tokens; returns the stop string if one now appears (the text is cut before it).
        With ``check_stop`` false (before ``min_tokens``) stop strings are not looked for."""
        if self.stop_reason is not None:
            return self.stop_reason
        start = len(self._text)
        for token_id in new_token_ids:
            self._token_ids.append(token_id)
            prefix = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._token_ids[self._prefix_offset :])
            if full.endswith("\ufffd") or len(full) <= len(prefix):
                continue  # an incomplete character (or nothing visible yet): wait for more
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._token_ids)
            if check_stop and self._find_stop(start):
                return self.stop_reason
        return None

    def _find_stop(self, new_text_start: int) -> bool:
        search_from = max(new_text_start - self._holdback, 0)
        hits = [(index, s) for s in self._stop if (index := self._text.find(s, search_from)) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self._text = self._text[:index]
        self.stop_reason = stop
        return True

    def flush(self) -> None:
        """At the end of the request: take any bytes still waiting to form a character."""
        if self.stop_reason is None and self._read_offset < len(self._token_ids):
            prefix = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._token_ids[self._prefix_offset :])
            self._text += full[len(prefix) :]
            self._read_offset = len(self._token_ids)

    def output_text(self, finished: bool) -> str:
        """The text a client may see now: all of it once finished, else minus the hold-back."""
        if finished or self.stop_reason is not None or self._holdback == 0:
            return self._text
        return self._text[: max(len(self._text) - self._holdback, 0)]
