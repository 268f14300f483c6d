"""An API body as engine requests: the model check, the prompt's token ids, the completion
length and the sampling parameters, with a 400 naming the parameter for what cannot run."""

from kvserve.engine.lora.lora_request import LoRARequest
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.chat_tools import template_messages, template_tools
from kvserve.server.errors import APIError, bad_request
from kvserve.server.protocol.chat import ChatMessage, Tool
from kvserve.server.protocol.sampling import SamplingBody
from kvserve.server.state import ServerState


def check_model(state: ServerState, model: str | None) -> LoRARequest | None:
    """The LoRA adapter a request's ``model`` names (None: the base model); 404 if it
    names neither the served model nor a loaded adapter."""
    if model is None or model == state.model_name:
        return None
    lora = state.loras.get(model)
    if lora is None:
        raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")
    return lora


def sampling_params(
    body: SamplingBody,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    constraint: OutputConstraint | None = None,
    skip_special_tokens: bool = True,
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
            skip_special_tokens=skip_special_tokens,
        )
    except ValueError as exc:
        raise invalid_parameter(exc, None) from None


def invalid_parameter(exc: ValueError, default_param: str | None) -> APIError:
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
