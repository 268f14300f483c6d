"""``/v1/completions`` and ``/v1/chat/completions`` over the ``AsyncLLM``.

One API request becomes one engine request per (prompt, sample): choice ``p * n + i``
is sample ``i`` of prompt ``p``, with seed ``seed + i`` when a seed is given, so that
the samples differ but each is reproducible. Their outputs are merged as they come; a
choice's text and tokens are cumulative in the engine's outputs and the deltas are
taken here, so the streamed deltas always add up to the non-streamed text.
"""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.outputs import RequestOutput
from kvserve.engine.sampling_params import SamplingParams
from kvserve.server.drain import DrainState
from kvserve.server.errors import APIError, bad_request
from kvserve.server.logprobs import chat_logprobs, completion_logprobs
from kvserve.server.metrics import ServerMetrics
from kvserve.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingBody,
    parse_body,
)
from kvserve.server.sse import DONE, open_event_stream, send_event


@dataclass
class ServerState:
    llm: AsyncLLM
    model_name: str
    model_path: str
    metrics: ServerMetrics
    drain: DrainState
    api_key: str | None = None
    max_waiting_requests: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: itertools.count = field(default_factory=itertools.count)

    def engine_request_id(self, api_id: str, choice: int) -> str:
        return f"{api_id}-{next(self._ids)}-{choice}"


@dataclass
class _Choice:
    """One choice: its latest output and how much of it was sent."""

    index: int
    output: RequestOutput | None = None
    text_len: int = 0  # characters of the output's text already sent
    num_tokens: int = 0  # output tokens already sent
    sent_chars: int = 0  # characters sent in all, echoed prompt included
    started: bool = False

    def take(self, output: RequestOutput, delta: bool) -> tuple[str, list[int], list, bool]:
        """The text, token ids and logprobs not sent yet (all if not ``delta``), and
        whether this is the choice's first piece; marks them sent."""
        completion = output.outputs[0]
        text_from, tokens_from = (self.text_len, self.num_tokens) if delta else (0, 0)
        first = not (delta and self.started)
        text = completion.text[text_from:]
        token_ids = completion.token_ids[tokens_from:]
        logprobs = (completion.logprobs or [])[tokens_from:]
        self.output = output
        self.text_len, self.num_tokens = len(completion.text), len(completion.token_ids)
        self.started = True
        return text, token_ids, logprobs, first


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


def check_capacity(state: ServerState) -> None:
    limit = state.max_waiting_requests
    if limit is not None and state.llm.num_waiting >= limit:
        state.metrics.rejected.inc()
        raise APIError(503, f"the server is at capacity ({limit} requests waiting); retry later")


def sampling_params(
    body: SamplingBody, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None
) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k in (None, -1) else body.top_k,
            min_p=body.min_p or 0.0,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=body.repetition_penalty or 1.0,
            seed=body.seed,
            stop=tuple(body.stop_list),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    except ValueError as exc:
        raise _invalid(exc, None) from None


def _invalid(exc: ValueError, default_param: str | None) -> APIError:
    """A 400 for an engine ``ValueError``, naming the parameter of an "invalid <name>: ..."."""
    message = str(exc)
    param = message[8:].split(":")[0] if message.startswith("invalid ") else default_param
    return bad_request(message, param)


def max_new_tokens(
    state: ServerState, prompt_len: int, requested: int | None, default: int | None, source: str
) -> int:
    """The completion length: ``requested``, else ``default``, else the rest of the context;
    400 if the prompt (from the ``source`` parameter) and it do not fit the context."""
    limit = state.llm.max_model_len
    if prompt_len >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"has {prompt_len} tokens, which leaves no room for a completion.",
            source,
        )
    wanted = requested or default or limit - prompt_len
    if prompt_len + wanted > limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + wanted} tokens ({prompt_len} in the prompt, {wanted} for the "
            "completion). Please reduce the prompt or the completion length.",
            "max_tokens",
        )
    return wanted


async def _start(
    state: ServerState,
    api_id: str,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    n: int,
) -> list[tuple[str, AsyncIterator[RequestOutput]]]:
    """Add every (prompt, sample) to the engine; if one is refused, abort those added.

    With prefix caching on, the other samples of a prompt are added once the first has
    computed it, so that they share its cached blocks instead of computing their own."""
    started: list[tuple[str, AsyncIterator[RequestOutput]]] = []
    share = n > 1 and state.llm.engine.config.enable_prefix_caching
    try:
        for p, prompt in enumerate(prompts):
            for i in range(n):
                request_id = state.engine_request_id(api_id, p * n + i)
                stream = await state.llm.add_request(request_id, prompt, params[i])
                started.append((request_id, stream))
                if i == 0 and share:
                    started[-1] = (request_id, await _after_prefill(stream))
    except BaseException as exc:
        for request_id, _ in started:
            state.llm.abort(request_id)
        if isinstance(exc, ValueError):
            raise _invalid(exc, "prompt") from None
        raise
    return started


async def _after_prefill(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """Wait for the stream's first output, then return the stream, that output included."""
    first = await anext(stream)

    async def replay() -> AsyncIterator[RequestOutput]:
        yield first
        async for output in stream:
            yield output

    return replay()


async def _merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator:
    """``(choice index, output)`` from every stream, as they come; leaving early aborts all."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _child_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    if params.seed is None:
        return [params] * n
    return [params.replace(seed=params.seed + i) for i in range(n)]


def _usage(prompt_lens: Sequence[int], choices: Sequence[_Choice]) -> dict:
    prompt_tokens = sum(prompt_lens)
    completion_tokens = sum(c.num_tokens for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class _Run:
    """One API request in flight: its choices and how to frame them."""

    def __init__(self, state: ServerState, request: web.Request, chat: bool) -> None:
        self.state = state
        self.request = request
        self.chat = chat
        self.api_id = ("chatcmpl-" if chat else "cmpl-") + request["request_id"]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def envelope(self, choices: list, chunk: bool) -> dict:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        return {
            "id": self.api_id,
            "object": obj,
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        }


async def create_completion(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = parse_body(CompletionRequest, await read_json(request))
    check_model(state, body.model)
    tokenizer = state.llm.tokenizer
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in body.prompts]
    max_tokens = max_new_tokens(state, max(len(p) for p in prompts), body.max_tokens, 16, "prompt")
    prompt_logprobs = body.logprobs if body.echo else None
    params = sampling_params(body, max_tokens, body.logprobs, prompt_logprobs)
    check_capacity(state)
    run = _Run(state, request, chat=False)
    started = await _start(state, run.api_id, prompts, _child_params(params, body.n), body.n)

    def render(choice: _Choice, delta: bool) -> dict | None:
        output = choice.output
        assert output is not None
        text, token_ids, logprobs, first = choice.take(output, delta)
        finish_reason = output.outputs[0].finish_reason
        if delta and not text and finish_reason is None:
            return None
        if body.echo and first:
            prompt_ids = prompts[choice.index // body.n]
            text = tokenizer.decode(prompt_ids) + text
            if body.logprobs is not None:
                token_ids = prompt_ids + token_ids
                logprobs = list(output.prompt_logprobs or []) + logprobs
        offset = choice.sent_chars if delta else 0
        choice.sent_chars = offset + len(text)
        return {
            "index": choice.index,
            "text": text,
            "logprobs": None
            if body.logprobs is None
            else completion_logprobs(tokenizer, token_ids, logprobs, offset),
            "finish_reason": finish_reason,
            "stop_reason": output.outputs[0].stop_reason,
        }

    return await _respond(run, body, started, [len(p) for p in prompts], render)


async def create_chat_completion(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = parse_body(ChatCompletionRequest, await read_json(request))
    check_model(state, body.model)
    prompt = chat_prompt_ids(state, body.messages, body.add_generation_prompt)
    max_tokens = max_new_tokens(state, len(prompt), body.max_new_tokens, None, "messages")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, max_tokens, logprobs, None)
    check_capacity(state)
    run = _Run(state, request, chat=True)
    started = await _start(state, run.api_id, [prompt], _child_params(params, body.n), body.n)
    tokenizer = state.llm.tokenizer

    def render(choice: _Choice, delta: bool) -> dict | None:
        output = choice.output
        assert output is not None
        text, token_ids, token_logprobs, first = choice.take(output, delta)
        finish_reason = output.outputs[0].finish_reason
        if delta and not text and finish_reason is None and not first:
            return None
        message = {"role": "assistant", "content": text} if first else {"content": text}
        return {
            "index": choice.index,
            "delta" if delta else "message": message,
            "logprobs": chat_logprobs(tokenizer, token_ids, token_logprobs)
            if body.logprobs
            else None,
            "finish_reason": finish_reason,
            "stop_reason": output.outputs[0].stop_reason,
        }

    return await _respond(run, body, started, [len(prompt)], render)


def chat_prompt_ids(
    state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool
) -> list[int]:
    tokenizer = state.llm.tokenizer
    if not tokenizer.chat_template:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    conversation = [{"role": m.role, "content": m.text} for m in messages]
    text = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


async def read_json(request: web.Request):
    try:
        return await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None


async def _respond(
    run: _Run,
    body: SamplingBody,
    started: list[tuple[str, AsyncIterator[RequestOutput]]],
    prompt_lens: list[int],
    render: Callable[[_Choice, bool], dict | None],
) -> web.StreamResponse:
    """Stream the choices as server-sent events, or answer with all of them at the end.
    However this ends (a client gone, an error), no choice is left running."""
    choices = [_Choice(i) for i in range(len(started))]
    try:
        return await _send(run, body, [s for _, s in started], choices, prompt_lens, render)
    finally:
        for choice, (request_id, _) in zip(choices, started, strict=True):
            if choice.output is None or not choice.output.finished:
                run.state.llm.abort(request_id)


async def _send(run, body, streams, choices, prompt_lens, render) -> web.StreamResponse:
    if not body.stream:
        async for index, output in _merge(streams):
            choices[index].output = output
        rendered = [render(choice, False) for choice in choices]
        usage = {"usage": _usage(prompt_lens, choices)}
        return web.json_response(run.envelope(rendered, chunk=False) | usage)
    response = await open_event_stream(run.request)
    options = body.stream_options
    async for index, output in _merge(streams):
        choice = choices[index]
        choice.output = output
        piece = render(choice, True)
        if piece is None:
            continue
        chunk = run.envelope([piece], chunk=True)
        if options is not None and options.continuous_usage_stats:
            chunk["usage"] = _usage(prompt_lens, choices)
        elif body.include_usage:
            chunk["usage"] = None
        await send_event(response, chunk)
    if body.include_usage:
        usage = {"usage": _usage(prompt_lens, choices)}
        await send_event(response, run.envelope([], chunk=True) | usage)
    await send_event(response, DONE)
    await response.write_eof()
    return response
