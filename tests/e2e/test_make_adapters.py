"""The adapters the e2e image bakes (e2e/make_adapters.py) fit the demo model and change its
answers, each its own way."""

import json
import stat
import sys
from pathlib import Path

import torch
from k8s.support import ROOT
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(ROOT / "e2e"))
from make_adapters import ALPHA, RANK, main

DEMO = ROOT / "server" / "default_model"


def merged_greedy(adapter: Path | None, prompt: list[int]) -> list[int]:
    """The demo model's greedy continuation with ``adapter`` merged into its weights."""
    model = AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32)
    if adapter is not None:
        tensors = load_file(adapter / "adapter_model.safetensors")
        weights = dict(model.named_parameters())
        with torch.no_grad():
            for key, a in tensors.items():
                if key.endswith(".lora_A.weight"):
                    prefix = key.removesuffix(".lora_A.weight")
                    b = tensors[f"{prefix}.lora_B.weight"]
                    name = prefix.removeprefix("base_model.model.") + ".weight"
                    weights[name] += (ALPHA / RANK) * b @ a
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def test_adapters_fit_the_demo_model_and_answer_each_their_own_way(tmp_path: Path) -> None:
    assert main([str(DEMO), str(tmp_path), "pirate", "poet"]) == 0
    config = json.loads((tmp_path / "pirate" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["target_modules"]) == (
        "LORA",
        RANK,
        ["q_proj", "v_proj"],
    )
    tensors = load_file(tmp_path / "pirate" / "adapter_model.safetensors")
    assert len(tensors) == 4 * 2 * 2
    assert tensors["base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight"].shape == (
        2 * 32,
        RANK,
    )
    for written in (tmp_path / "poet").iterdir():
        assert stat.S_IMODE(written.stat().st_mode) == 0o644
    prompt = [5, 17, 300, 42]
    answers = [merged_greedy(a, prompt) for a in (None, tmp_path / "pirate", tmp_path / "poet")]
    assert len({tuple(a) for a in answers}) == 3, answers
