"""Output processing: what is new in a request since its previous output, as a
``RequestOutput`` delta (its text from the detokenizer, stop strings already applied)."""

from kvserve.engine.core.outputs import CompletionOutput, RequestOutput
from kvserve.engine.core.request import Request


def take_text(request: Request) -> str:
    """The request's text since its previous output (all of what is left once finished;
    none for a failed request). May raise: the detokenizer runs the tokenizer's code."""
    detokenizer = request.detokenizer
    assert detokenizer is not None
    if request.finish_reason == "error":
        return ""
    if request.is_finished:
        detokenizer.flush()
    return detokenizer.take(request.is_finished)


def delta_output(request: Request, text: str) -> RequestOutput:
    """What is new in the request since its previous output (see ``RequestOutput``), with
    ``text`` as its new text; marks it handed out. It slices only the new tokens and logprobs,
    so a step's work does not grow with the output."""
    sent, total = request.num_emitted_tokens, request.num_output_tokens
    tokens = request.all_token_ids[request.num_prompt_tokens + sent :]
    logprobs = request.logprobs[sent:] if request.params.logprobs is not None else None
    first = request.num_outputs == 0
    request.num_emitted_tokens, request.num_outputs = total, request.num_outputs + 1
    completion = CompletionOutput(
        0,
        tokens,
        text,
        request.finish_reason,
        request.stop_reason,
        logprobs,
        num_output_tokens=total,
    )
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=[completion],
        finished=request.is_finished,
        num_cached_tokens=request.num_cached_prompt_tokens,
        arrival_time=request.arrival_time,
        first_scheduled_time=request.first_scheduled_time,
        first_token_time=request.first_token_time,
        last_token_time=request.last_token_time,
        finished_time=request.finished_time,
        prompt_logprobs=request.prompt_logprobs
        if first and request.params.prompt_logprobs is not None
        else None,
    )
