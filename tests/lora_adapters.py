"""Random PEFT LoRA adapters on the tiny checkpoints, and the merged checkpoints that are
their transformers references."""

import shutil
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(
    base: Path, path: Path, rank: int, seed: int, targets: list[str] = TARGETS, **config
) -> Path:
    """A PEFT adapter of ``rank`` on ``targets`` of checkpoint ``base`` with random A and B
    (``init_lora_weights=False``: B is not zero, so the adapter changes the tokens), saved
    at ``path``; ``config``: more ``LoraConfig`` fields."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=targets,
        init_lora_weights=False,
        **config,
    )
    get_peft_model(model, lora).save_pretrained(path)
    return path


def merged_checkpoint(base: Path, adapter: Path, path: Path) -> Path:
    """``base`` with ``adapter`` merged into its weights, saved with ``base``'s tokenizer:
    what a served adapter must generate exactly as."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(path)
    for item in base.iterdir():
        if not item.name.endswith(".safetensors") and item.name != "config.json":
            shutil.copy(item, path / item.name)
    return path
