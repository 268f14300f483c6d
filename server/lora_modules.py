"""``--lora-modules`` as vLLM spells it: ``name=path``, or JSON
``{"name": ..., "path": ..., "base_model_name": ...}``."""

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAModule:
    """An adapter served from start-up; ``base_model_name``: the parent ``/v1/models``
    shows (default: the served model's name)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """One ``--lora-modules`` value; ValueError saying what is wrong with it."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules {text!r}: invalid JSON: {exc}") from exc
        if not isinstance(entry, dict) or set(entry) - {"name", "path", "base_model_name"}:
            raise ValueError(
                f"--lora-modules {text!r}: keys must be name, path and base_model_name"
            )
        name, path, base = entry.get("name"), entry.get("path"), entry.get("base_model_name")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise ValueError(f"--lora-modules {text!r}: name and path must be strings")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"--lora-modules {text!r}: base_model_name must be a string")
        return LoRAModule(name, path, base)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {text!r}: expected name=path or a JSON object")
    return LoRAModule(name, path)
