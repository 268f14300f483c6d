"""Incremental detokenization of one request's output, with stop strings.

Text grows token by token without ever emitting half a character: a byte-level token
may end inside a multi-byte UTF-8 sequence, so new text is only taken once the decode
of the recent window no longer ends in U+FFFD. Stop strings are searched across token
boundaries; the text returned is what precedes the first stop string.
"""

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded as left context of the first output tokens, so that tokenizers
# whose decoding depends on what precedes (leading spaces) give the same text as a whole.
_CONTEXT_TOKENS = 5


def decode_text(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], **options: bool) -> str:
    """``tokenizer.decode`` of one sequence, which is one string (typed ``str | list[str]``)."""
    text = tokenizer.decode(token_ids, **options)
    assert isinstance(text, str)
    return text


class Detokenizer:
    """``update`` with each new token, then ``take`` the text that is new since the last take.

    Invariant: text once taken is final, so the pieces ``take`` returns add up to the final
    text. ``_pending`` holds the decoded text not taken yet, and it is the only text a stop
    string can cut: while stop strings are set, ``take`` keeps the last ``_holdback``
    (``len(longest stop) - 1``) characters back until the request finishes, so a stop string
    found later starts inside ``_pending``. Taking every step keeps ``_pending`` short, and
    no step touches more than the recent window of tokens and ``_pending``.
    """

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
        self._read_offset = len(self._token_ids)  # tokens before this are already decoded
        self._pending = ""
        self.stop_reason: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return decode_text(
            self._tokenizer,
            ids,
            skip_special_tokens=self._skip_special,
            clean_up_tokenization_spaces=False,
        )

    def update(self, new_token_ids: Sequence[int], check_stop: bool = True) -> str | None:
        """Add tokens; returns the stop string if one now appears (the text is cut before it).
        With ``check_stop`` false (before ``min_tokens``) stop strings are not looked for."""
        if self.stop_reason is not None:
            return self.stop_reason
        start = len(self._pending)
        for token_id in new_token_ids:
            self._token_ids.append(token_id)
            prefix = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._token_ids[self._prefix_offset :])
            if full.endswith("\ufffd") or len(full) <= len(prefix):
                continue  # an incomplete character (or nothing visible yet): wait for more
            self._pending += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._token_ids)
            if check_stop and self._find_stop(start):
                return self.stop_reason
        return None

    def _find_stop(self, new_text_start: int) -> bool:
        search_from = max(new_text_start - self._holdback, 0)
        hits = [
            (index, s) for s in self._stop if (index := self._pending.find(s, search_from)) >= 0
        ]
        if not hits:
            return False
        index, stop = min(hits)
        self._pending = self._pending[:index]
        self.stop_reason = stop
        return True

    def flush(self) -> None:
        """At the end of the request: take any bytes still waiting to form a character."""
        if self.stop_reason is None and self._read_offset < len(self._token_ids):
            prefix = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
            full = self._decode(self._token_ids[self._prefix_offset :])
            self._pending += full[len(prefix) :]
            self._read_offset = len(self._token_ids)

    def take(self, finished: bool) -> str:
        """The text that is new since the last take and a client may see now: all that is
        pending once finished (or stopped), else all but the hold-back."""
        keep = 0 if finished or self.stop_reason is not None else self._holdback
        cut = max(len(self._pending) - keep, 0)
        taken, self._pending = self._pending[:cut], self._pending[cut:]
        return taken
