"""What a request names to run under an adapter (vLLM's ``LoRARequest``)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter directory served under ``lora_name``; ``lora_int_id`` is the caller's
    number for it (unique per name, > 0, as vLLM asks)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
        if self.lora_int_id < 1:
            raise ValueError(
                f"lora_int_id of {self.lora_name!r} must be > 0, got {self.lora_int_id}"
            )
