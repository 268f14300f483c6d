"""The HTTP side of the model-server protocol: a serving server answers ``/health`` with 200,
lists its model on ``/v1/models`` and answers OpenAI completions and chat completions.

Each check returns ``(passed, reason)``; the reason names what was asked and what came back.
"""

from typing import Any

from kvserve.conformance.client import Reply, Server
from kvserve.conformance.report import plural

MAX_TOKENS = 4
FINISH_REASONS = ("length", "stop")


def describe(method_path: str, reply: Reply) -> str:
    body = reply.body[:200].decode(errors="replace")
    return f"{method_path} answered {reply.status} ({reply.content_type}): {body!r}"


def _json_object(reply: Reply) -> dict[str, Any] | None:
    try:
        body = reply.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def check_health(server: Server) -> tuple[bool, str]:
    reply = server.get("/health")
    if reply.status != 200:
        return False, describe("GET /health", reply) + "; a serving server answers 200"
    return True, "GET /health answered 200"


def check_models(server: Server, wanted: str | None) -> tuple[bool, str, str | None]:
    """Also returns the model the other checks ask for: ``wanted``, or the first listed."""
    reply = server.get("/v1/models")
    body = _json_object(reply)
    if reply.status != 200 or body is None:
        return False, describe("GET /v1/models", reply), wanted
    data = body.get("data")
    if (
        body.get("object") != "list"
        or not isinstance(data, list)
        or not all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("object") == "model"
            for c in data
        )
    ):
        shape = "an object 'list' whose 'data' holds cards with a string 'id' and object 'model'"
        return False, f"GET /v1/models is not {shape}: {reply.body[:200]!r}", wanted
    ids = [card["id"] for card in data]
    if not ids:
        return False, "GET /v1/models lists no model", wanted
    model = wanted or ids[0]
    if model not in ids:
        return False, f"model {model!r} is not listed; listed: {', '.join(ids)}", wanted
    return True, f"lists {model!r} ({plural(len(ids), 'model')})", model


def _check_choice(path: str, reply: Reply, model: str, kind: str) -> tuple[bool, str]:
    """One choice of at most ``MAX_TOKENS`` tokens: text for a completion, an assistant
    message for a chat completion."""
    body = _json_object(reply)
    if reply.status != 200 or body is None:
        return False, describe(f"POST {path}", reply)
    problems = []
    if body.get("object") != kind:
        problems.append(f"'object' is {body.get('object')!r}, not {kind!r}")
    if body.get("model") != model:
        problems.append(f"'model' is {body.get('model')!r}, not {model!r}")
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else {}
    if not choice:
        problems.append("not exactly one choice")
    elif kind == "text_completion" and not isinstance(choice.get("text"), str):
        problems.append("the choice has no string 'text'")
    elif kind == "chat.completion" and not _assistant_message(choice.get("message")):
        problems.append("the choice's message is not an assistant's with string content")
    reason = choice.get("finish_reason")
    if choice and reason not in FINISH_REASONS:
        problems.append(f"finish_reason is {reason!r}, not one of {', '.join(FINISH_REASONS)}")
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or not 0 <= tokens <= MAX_TOKENS:
        problems.append(f"usage.completion_tokens is {tokens!r}, not 0..{MAX_TOKENS}")
    if problems:
        return False, f"POST {path} answered 200 but " + "; ".join(problems)
    return True, f"POST {path} answered 200: a {kind} of {tokens} tokens ({reason})"


def _assistant_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str)
    )


def check_completion(server: Server, model: str) -> tuple[bool, str]:
    body = {"model": model, "prompt": "Hello", "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = server.post("/v1/completions", body)
    return _check_choice("/v1/completions", reply, model, "text_completion")


def check_chat(server: Server, model: str) -> tuple[bool, str]:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = server.post("/v1/chat/completions", body)
    return _check_choice("/v1/chat/completions", reply, model, "chat.completion")
