"""OpenAI response framing: each choice's engine deltas as the pieces it sends (stream
chunks, or one whole message joined from all of them), the envelope, and the usage.

A choice's pieces are its deltas in order, never re-sliced: a streamed piece joins the
deltas received since the last one, a whole response joins all of them, so the streamed
pieces always add up to the non-streamed text.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from kvserve.engine.core.outputs import Logprob, RequestOutput, join_outputs
from kvserve.engine.detokenizer import decode_text
from kvserve.server.chat_reading import ChatReading
from kvserve.server.logprobs import chat_logprobs, completion_logprobs
from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.protocol.completions import CompletionRequest


@dataclass(frozen=True)
class Piece:
    """What a choice sends next: its unsent deltas joined, and whether it is its first."""

    output: RequestOutput
    first: bool


@dataclass
class Choice:
    """One choice: the engine's deltas not sent yet, its latest output, what was sent."""

    index: int
    unsent: list[RequestOutput] = field(default_factory=list)
    latest: RequestOutput | None = None
    token_chars: int = 0  # characters of the tokens sent (echo included): the next text_offset
    started: bool = False

    @property
    def finished(self) -> bool:
        return self.latest is not None and self.latest.outputs[0].finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return 0 if self.latest is None else self.latest.outputs[0].num_output_tokens

    def receive(self, output: RequestOutput) -> None:
        self.unsent.append(output)
        self.latest = output

    def take(self, stream: bool, send_empty_first: bool = False) -> Piece | None:
        """The unsent deltas as one piece, marked sent. In a ``stream``, ``None`` (nothing
        marked) while they bring no text and do not end the choice, unless this is the first
        piece and ``send_empty_first``: their tokens (inside a multi-byte character, or
        special) go with the next piece, so that every token's logprobs are sent."""
        latest = self.latest
        assert latest is not None
        first = not self.started
        completion = latest.outputs[0]
        unfinished = completion.finish_reason is None
        if stream and not completion.text and unfinished and not (first and send_empty_first):
            return None
        piece = Piece(join_outputs(self.unsent), first)
        self.unsent = []
        self.started = True
        return piece


Render = Callable[[Choice, bool], dict | None]
"""A choice's next piece as an OpenAI choice (``True``: a stream chunk's), or ``None``."""


@dataclass(frozen=True)
class Framing:
    """The envelope of one API request's responses."""

    api_id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, request_id: str, model: str, chat: bool) -> "Framing":
        return cls(("chatcmpl-" if chat else "cmpl-") + request_id, model, chat)

    def envelope(self, choices: list, chunk: bool) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.api_id,
            "object": obj + (".chunk" if chunk and self.chat else ""),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def cut_piece(self, choice: Choice) -> dict:
        """The last piece of a choice cut short by the drain deadline."""
        content: dict = {"delta": {}} if self.chat else {"text": ""}
        cut = {"logprobs": None, "finish_reason": "abort", "stop_reason": None}
        return {"index": choice.index, **content, **cut}


def usage(prompt_lens: Sequence[int], choices: Sequence[Choice]) -> dict:
    prompt_tokens = sum(prompt_lens)
    completion_tokens = sum(c.num_tokens for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_render(
    tokenizer: PreTrainedTokenizerBase, body: CompletionRequest, prompts: list[list[int]]
) -> Render:
    """Legacy completion choices: ``text``, with the prompt first for ``echo``."""

    def render(choice: Choice, delta: bool) -> dict | None:
        piece = choice.take(delta)
        if piece is None:
            return None
        output, first = piece.output, piece.first
        completion = output.outputs[0]
        text, token_ids = completion.text, completion.token_ids
        logprobs: list[Logprob | None] = list(completion.logprobs or [])
        if body.echo and first:
            prompt_ids = prompts[choice.index // body.n]
            text = decode_text(tokenizer, prompt_ids) + text
            if body.logprobs is not None:
                token_ids = prompt_ids + token_ids
                logprobs = list(output.prompt_logprobs or []) + logprobs
        token_logprobs = None
        if body.logprobs is not None:
            offset = choice.token_chars if delta else 0
            token_logprobs = completion_logprobs(tokenizer, token_ids, logprobs, offset)
            choice.token_chars = offset + sum(len(t) for t in token_logprobs["tokens"])
        return {
            "index": choice.index,
            "text": text,
            "logprobs": token_logprobs,
            "finish_reason": completion.finish_reason,
            "stop_reason": completion.stop_reason,
        }

    return render


def chat_render(
    tokenizer: PreTrainedTokenizerBase,
    body: ChatCompletionRequest,
    reading: ChatReading | None,
    num_choices: int,
) -> Render:
    """Chat choices: an assistant ``message`` (``delta`` in a stream), with tool calls and
    reasoning read out of the text when the request uses tools or the server a reasoning
    parser (``reading``)."""
    streams = [reading.stream() for _ in range(num_choices)] if reading is not None else []

    def render(choice: Choice, delta: bool) -> dict | None:
        piece = choice.take(delta, send_empty_first=True)
        if piece is None:
            return None
        completion, first = piece.output.outputs[0], piece.first
        finish_reason = completion.finish_reason
        message: dict = {"content": completion.text}
        if reading is not None and delta:
            stream = streams[choice.index]
            message = stream.delta(completion.text, finish_reason is not None)
            finish_reason = reading.finish_reason(finish_reason, stream.called)
            if not (message or first or finish_reason or body.logprobs):
                return None
        elif reading is not None:
            message, called = reading.message(completion.text)
            finish_reason = reading.finish_reason(finish_reason, called)
        if first:
            message = {"role": "assistant"} | message
        return {
            "index": choice.index,
            "delta" if delta else "message": message,
            "logprobs": chat_logprobs(tokenizer, completion.token_ids, completion.logprobs or [])
            if body.logprobs
            else None,
            "finish_reason": finish_reason,
            "stop_reason": completion.stop_reason,
        }

    return render
