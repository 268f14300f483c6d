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

from kvserve.engine.async_llm import AsyncLLM, EngineDeadError, RequestFailedError
from kvserve.engine.outputs import RequestOutput
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.admission import Admission, Reservation
from kvserve.server.body import read_json
from kvserve.server.chat_tools import chat_constraint, template_messages, template_tools, tool_use
from kvserve.server.drain import DrainState
from kvserve.server.errors import APIError, bad_request, unavailable
from kvserve.server.logprobs import chat_logprobs, completion_logprobs
from kvserve.server.metrics import ServerMetrics
from kvserve.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingBody,
    Tool,
    parse_body,
)
from kvserve.server.sse import DONE, open_event_stream, send_event
from kvserve.server.structured import checked_constraint


@dataclass
class ServerState:
    llm: AsyncLLM
    model_name: str
    model_path: str
    metrics: ServerMetrics
    drain: DrainState
    api_key: str | None = None
    max_waiting_requests: int | None = None
    body_timeout: float = 30.0  # seconds a request body may take to arrive
    auto_tool_parser: str | None = None  # for tool_choice "auto": --tool-call-parser, if enabled
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: itertools.count = field(default_factory=itertools.count)
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        batch = self.llm.engine.config.max_num_seqs
        self.admission = Admission(self.max_waiting_requests, batch)

    def engine_request_id(self, api_id: str, choice: int) -> str:
        return f"{api_id}-{next(self._ids)}-{choice}"


@dataclass
class _Choice:
    """One choice: its latest output and how much of it was sent."""

    index: int
    output: RequestOutput | None = None
    text_len: int = 0  # characters of the output's text already sent
    num_tokens: int = 0  # output tokens already sent
    token_chars: int = 0  # characters of the tokens sent (echo included): the next text_offset
    started: bool = False

    @property
    def finished(self) -> bool:
        return self.output is not None and self.output.finished

    def take(
        self, output: RequestOutput, delta: bool, send_empty_first: bool = False
    ) -> tuple[str, list[int], list, bool] | None:
        """The text, token ids and logprobs not sent yet (all if not ``delta``), and
        whether this is the choice's first piece; marks them sent. ``None`` (nothing
        marked) for a delta without new text that does not end the choice, unless it is
        the first and ``send_empty_first``: its tokens (inside a multi-byte character, or
        special) go with the next piece, so that every token's logprobs are sent."""
        completion = output.outputs[0]
        text_from, tokens_from = (self.text_len, self.num_tokens) if delta else (0, 0)
        first = not (delta and self.started)
        text = completion.text[text_from:]
        unfinished = completion.finish_reason is None
        if delta and not text and unfinished and not (first and send_empty_first):
            return None
        token_ids = completion.token_ids[tokens_from:]
        logprobs = (completion.logprobs or [])[tokens_from:]
        self.output = output
        self.text_len, self.num_tokens = len(completion.text), len(completion.token_ids)
        self.started = True
        return text, token_ids, logprobs, first


REQUEST_ID = web.RequestKey("request_id", str)
"""The request's id: the client's X-Request-Id, or a fresh one (set by the app's middleware)."""


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


def admit(state: ServerState, count: int, param: str) -> Reservation:
    """Reserve ``count`` engine requests against the queue limit (see ``admission``)."""
    try:
        return state.admission.reserve(count, param)
    except APIError as exc:
        if exc.status == 503:
            state.metrics.on_rejected()
        raise


def sampling_params(
    body: SamplingBody,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    constraint: OutputConstraint | None = None,
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
            constraint=constraint,
        )
    except ValueError as exc:
        raise _invalid(exc, None) from None


ENGINE_ERRORS = (EngineDeadError, RequestFailedError)


def engine_error(exc: EngineDeadError | RequestFailedError) -> APIError:
    """A 503 once the engine is dead (this replica is no longer ready: retry elsewhere), a
    500 for a request the engine failed on while it went on with the others."""
    if isinstance(exc, EngineDeadError):
        return unavailable("the engine stopped and this server can serve no request", "engine_dead")
    return APIError(500, "the engine failed while generating this request", code="engine_error")


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
    run: "_Run", prompts: Sequence[list[int]], params: Sequence[SamplingParams], n: int
) -> list[tuple[str, AsyncIterator[RequestOutput]]]:
    """Admit the request, then add every (prompt, sample) to the engine; if one is
    refused, abort those added.

    With prefix caching on, the other samples of a prompt are added once the first has
    computed it, so that they share its cached blocks instead of computing their own."""
    state = run.state
    run.reservation = admit(state, len(prompts) * n, "n" if n > 1 else run.prompt_param)
    started: list[tuple[str, AsyncIterator[RequestOutput]]] = []
    share = n > 1 and state.llm.engine.config.enable_prefix_caching
    try:
        for p, prompt in enumerate(prompts):
            for i in range(n):
                request_id = state.engine_request_id(run.api_id, p * n + i)
                stream = await state.llm.add_request(request_id, prompt, params[i])
                started.append((request_id, stream))
                if i == 0 and share:
                    started[-1] = (request_id, await _after_prefill(stream))
    except BaseException as exc:
        run.reservation.close()
        for request_id, _ in started:
            state.llm.abort(request_id)
        if isinstance(exc, ValueError):
            raise _invalid(exc, "prompt") from None
        if isinstance(exc, ENGINE_ERRORS):
            raise engine_error(exc) from None
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
        self.api_id = ("chatcmpl-" if chat else "cmpl-") + request[REQUEST_ID]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.prompt_param = "messages" if chat else "prompt"
        self.reservation: Reservation | None = None

    def receive(self, choice: _Choice, output: RequestOutput) -> None:
        choice.output = output
        if output.finished:
            assert self.reservation is not None
            self.reservation.done(choice.index)

    def cut_piece(self, choice: _Choice) -> dict:
        """The last piece of a choice cut short by the drain deadline."""
        content = {"delta": {}} if self.chat else {"text": ""}
        cut = {"logprobs": None, "finish_reason": "abort", "stop_reason": None}
        return {"index": choice.index, **content, **cut}

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
    body = parse_body(CompletionRequest, await read_json(request, state.body_timeout))
    check_model(state, body.model)
    tokenizer = state.llm.tokenizer
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in body.prompts]
    max_tokens = max_new_tokens(state, max(len(p) for p in prompts), body.max_tokens, 16, "prompt")
    prompt_logprobs = body.logprobs if body.echo else None
    constraint = await checked_constraint(state.llm.grammars, body)
    params = sampling_params(body, max_tokens, body.logprobs, prompt_logprobs, constraint)
    run = _Run(state, request, chat=False)
    started = await _start(run, prompts, _child_params(params, body.n), body.n)

    def render(choice: _Choice, delta: bool) -> dict | None:
        output = choice.output
        assert output is not None
        taken = choice.take(output, delta)
        if taken is None:
            return None
        text, token_ids, logprobs, first = taken
        finish_reason = output.outputs[0].finish_reason
        if body.echo and first:
            prompt_ids = prompts[choice.index // body.n]
            text = tokenizer.decode(prompt_ids) + text
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
            "finish_reason": finish_reason,
            "stop_reason": output.outputs[0].stop_reason,
        }

    return await _respond(run, body, started, [len(p) for p in prompts], render)


async def create_chat_completion(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = parse_body(ChatCompletionRequest, await read_json(request, state.body_timeout))
    check_model(state, body.model)
    tools = tool_use(body, state.auto_tool_parser)
    prompt = chat_prompt_ids(state, body.messages, body.add_generation_prompt, body.tools)
    max_tokens = max_new_tokens(state, len(prompt), body.max_new_tokens, None, "messages")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    constraint = await chat_constraint(state.llm.grammars, body, tools)
    params = sampling_params(body, max_tokens, logprobs, None, constraint)
    run = _Run(state, request, chat=True)
    started = await _start(run, [prompt], _child_params(params, body.n), body.n)
    tokenizer = state.llm.tokenizer
    streams = [tools.stream() for _ in started] if tools is not None else []

    def render(choice: _Choice, delta: bool) -> dict | None:
        output = choice.output
        assert output is not None
        taken = choice.take(output, delta, send_empty_first=True)
        if taken is None:
            return None
        text, token_ids, token_logprobs, first = taken
        finish_reason = output.outputs[0].finish_reason
        message: dict = {"content": text}
        if tools is not None and delta:
            stream = streams[choice.index]
            message = stream.delta(output.outputs[0].text, finish_reason is not None)
            finish_reason = tools.finish_reason(finish_reason, stream.called)
            if not (message or first or finish_reason or body.logprobs):
                return None
        elif tools is not None:
            message, called = tools.message(output.outputs[0].text)
            finish_reason = tools.finish_reason(finish_reason, called)
        if first:
            message = {"role": "assistant"} | message
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
    state: ServerState,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: list[Tool] | None = None,
) -> list[int]:
    tokenizer = state.llm.tokenizer
    if not tokenizer.chat_template:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    text = tokenizer.apply_chat_template(
        template_messages(messages),
        tools=template_tools(tools),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
    return tokenizer.encode(text, add_special_tokens=False)


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
        run.reservation.close()


async def _send(run, body, streams, choices, prompt_lens, render) -> web.StreamResponse:
    """The response; at the drain deadline a stream ends with ``finish_reason: "abort"``
    for each unfinished choice and ``[DONE]``, and a whole response becomes a 503."""
    outputs = run.state.drain.until_cut(_merge(streams))
    if not body.stream:
        try:
            async for index, output in outputs:
                run.receive(choices[index], output)
        except ENGINE_ERRORS as exc:
            raise engine_error(exc) from None
        if not all(choice.finished for choice in choices):
            raise unavailable("the server shut down before this request finished; retry it")
        rendered = [render(choice, False) for choice in choices]
        usage = {"usage": _usage(prompt_lens, choices)}
        return web.json_response(run.envelope(rendered, chunk=False) | usage)
    response = await open_event_stream(run.request)
    try:
        await _stream(run, body, outputs, response, choices, prompt_lens, render)
    except ENGINE_ERRORS as exc:  # an error event, then [DONE], as vLLM ends a failed stream
        await send_event(response, engine_error(exc).body())
        await send_event(response, DONE)
        await response.write_eof()
        return response
    for choice in choices:
        if not choice.finished:
            await send_event(response, run.envelope([run.cut_piece(choice)], chunk=True))
    if body.include_usage:
        usage = {"usage": _usage(prompt_lens, choices)}
        await send_event(response, run.envelope([], chunk=True) | usage)
    await send_event(response, DONE)
    await response.write_eof()
    return response


async def _stream(run, body, outputs, response, choices, prompt_lens, render) -> None:
    """Each choice's pieces as events, as the engine's outputs come."""
    options = body.stream_options
    async for index, output in outputs:
        choice = choices[index]
        run.receive(choice, output)
        piece = render(choice, True)
        if piece is None:
            continue
        chunk = run.envelope([piece], chunk=True)
        if options is not None and options.continuous_usage_stats:
            chunk["usage"] = _usage(prompt_lens, choices)
        elif body.include_usage:
            chunk["usage"] = None
        await send_event(response, chunk)
