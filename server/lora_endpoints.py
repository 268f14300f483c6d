"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, as vLLM answers them
(routed only when ``--allow-runtime-lora-updating``, env
``KVSERVE_ALLOW_RUNTIME_LORA_UPDATING``: vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).

Success is 200 with vLLM's plain-text message. A body without the names, an adapter already
loaded, or one that cannot be served (LoRA off, missing path, corrupt file, a rank, target
module or shape that does not fit the model) is a 400 naming it; unloading an adapter that
is not loaded is a 404. A failed load changes nothing. Unloading an adapter that requests
are running under does not interrupt them: they finish under it; requests that name it
after the unload get 404.
"""

from aiohttp import web

from kvserve.server.body import read_json
from kvserve.server.errors import APIError, bad_request
from kvserve.server.state import ServerState


def _names(body: object, fields: tuple[str, ...]) -> list[str]:
    values = [body.get(f) if isinstance(body, dict) else None for f in fields]
    if not all(isinstance(v, str) and v for v in values):
        quoted = " and ".join(f"'{f}'" for f in fields)
        raise bad_request(
            f"{'Both ' if len(fields) > 1 else ''}{quoted} must be provided.", fields[0]
        )
    return [str(v) for v in values]


async def load_lora_adapter(state: ServerState, request: web.Request) -> web.Response:
    body = await read_json(request, state.body_timeout)
    name, path = _names(body, ("lora_name", "lora_path"))
    if name in state.loras.by_name or name == state.model_name:
        raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    lora = state.loras.new_request(name, path)
    try:
        await state.llm.add_lora(lora)
    except ValueError as exc:
        raise bad_request(str(exc), "lora_path") from None
    state.loras.add(lora, state.model_name)
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(state: ServerState, request: web.Request) -> web.Response:
    body = await read_json(request, state.body_timeout)
    (name,) = _names(body, ("lora_name",))
    if name not in state.loras.by_name:
        raise APIError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
    state.loras.remove(name)
    await state.llm.remove_lora(name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
