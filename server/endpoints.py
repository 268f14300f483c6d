"""``/v1/completions`` and ``/v1/chat/completions``: the body read and checked, turned into
engine requests (``request_params``), fanned out (``fan_out``), and each choice's deltas
framed (``responses``) and sent (``streaming``)."""

from aiohttp import web

from kvserve.server.body import read_json
from kvserve.server.chat_reading import ChatReading
from kvserve.server.chat_tools import chat_constraint, tool_use
from kvserve.server.fan_out import fan_out
from kvserve.server.protocol.base import parse_body
from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.protocol.completions import CompletionRequest
from kvserve.server.reasoning_parsers import REASONING_PARSERS
from kvserve.server.request_params import (
    chat_prompt_ids,
    check_model,
    max_new_tokens,
    sampling_params,
)
from kvserve.server.responses import Framing, chat_render, completion_render
from kvserve.server.state import REQUEST_ID, ServerState
from kvserve.server.streaming import Reply, respond
from kvserve.server.structured import checked_constraint


async def create_completion(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = parse_body(CompletionRequest, await read_json(request, state.body_timeout))
    lora = check_model(state, body.model)
    tokenizer = state.llm.tokenizer
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in body.prompts]
    max_tokens = max_new_tokens(state, max(len(p) for p in prompts), body.max_tokens, 16, "prompt")
    prompt_logprobs = body.logprobs if body.echo else None
    constraint = await checked_constraint(state.llm.grammars, body)
    params = sampling_params(body, max_tokens, body.logprobs, prompt_logprobs, constraint)
    model = state.model_name if lora is None else lora.lora_name
    framing = Framing.of(request[REQUEST_ID], model, chat=False)
    fan = await fan_out(state, framing.api_id, "prompt", prompts, params, body.n, lora)
    render = completion_render(tokenizer, body, prompts)
    prompt_lens = [len(p) for p in prompts]
    return await respond(Reply(state, request, body, framing, fan, prompt_lens, render))


async def create_chat_completion(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = parse_body(ChatCompletionRequest, await read_json(request, state.body_timeout))
    lora = check_model(state, body.model)
    tools = tool_use(body, state.auto_tool_parser)
    parser = state.reasoning_parser
    reasoning = REASONING_PARSERS[parser]() if parser is not None else None
    reading = ChatReading(tools, reasoning) if tools or reasoning else None
    prompt = chat_prompt_ids(state, body.messages, body.add_generation_prompt, body.tools)
    max_tokens = max_new_tokens(state, len(prompt), body.max_new_tokens, None, "messages")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    constraint = await chat_constraint(state.llm.grammars, body, tools)
    special = reading is not None and reading.reads_special_tokens
    params = sampling_params(body, max_tokens, logprobs, None, constraint, not special)
    model = state.model_name if lora is None else lora.lora_name
    framing = Framing.of(request[REQUEST_ID], model, chat=True)
    fan = await fan_out(state, framing.api_id, "messages", [prompt], params, body.n, lora)
    render = chat_render(state.llm.tokenizer, body, reading, fan.num_choices)
    return await respond(Reply(state, request, body, framing, fan, [len(prompt)], render))
