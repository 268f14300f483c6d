"""Write tiny random LoRA adapters (PEFT's layout) for a Llama-shaped checkpoint: the e2e image
bakes some for the demo model, so that the adapter scenario needs no hub and no volume.

    python e2e/make_adapters.py MODEL_DIR OUT_DIR NAME [NAME ...]

Each ``OUT_DIR/NAME`` holds ``adapter_config.json`` and ``adapter_model.safetensors``: rank
``RANK`` on ``q_proj`` and ``v_proj`` of every layer, both factors random (seeded by the name),
so that each adapter shifts the model's greedy answer its own way (PEFT starts B at zero, which
would change nothing).
"""

import json
import sys
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")


def adapter_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """``lora_A`` (rank × in) and ``lora_B`` (out × rank) of each target, PEFT's names."""
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    out = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim,
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            a = torch.randn(RANK, hidden, generator=generator) / hidden**0.5
            b = torch.randn(out[target], RANK, generator=generator)
            tensors[f"{key}.lora_A.weight"] = a
            tensors[f"{key}.lora_B.weight"] = b
    return tensors


def write_adapter(model_dir: Path, out: Path, name: str) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    save_file(
        adapter_tensors(config, zlib.crc32(name.encode())), target / "adapter_model.safetensors"
    )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGETS),
    }
    (target / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    for written in target.iterdir():
        written.chmod(0o644)  # the image's files are root's; the server runs as another user
    return target


def main(argv: list[str]) -> int:
    model_dir, out, *names = argv
    for name in names:
        write_adapter(Path(model_dir), Path(out), name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
