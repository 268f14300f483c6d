"""An adapter that cannot be served is refused with its name and the field, file or tensor
at fault, and nothing already loaded changes."""

import json
import shutil

import pytest

from kvserve import LoRARequest
from kvserve.engine.lora.lora_registry import LoRARegistry
from kvserve.engine.lora.peft_adapter import LoRAAdapterError
from kvserve.engine.models.model_config import ModelConfig

from checkpoints import FAMILIES, build_checkpoint
from lora_adapters import build_adapter


@pytest.fixture(scope="module")
def base(checkpoint):
    return checkpoint("llama")


@pytest.fixture(scope="module")
def good(base, tmp_path_factory):
    return build_adapter(base, tmp_path_factory.mktemp("good") / "a", 8, seed=1)


def registry(base, max_rank=16) -> LoRARegistry:
    return LoRARegistry(ModelConfig.from_dir(str(base)), max_rank, max_cpu_loras=4)


def edited(good, tmp_path, **fields):
    path = tmp_path / "edited"
    shutil.copytree(good, path)
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, **fields}))
    return path


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(r=32), "r: rank 32 is above --max-lora-rank 16"),
        (dict(use_dora=True), "use_dora: DoRA"),
        (dict(bias="all"), "bias: 'all'"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(target_modules=["q_proj", "embed_tokens"]), "target_modules: ['embed_tokens']"),
        (dict(target_modules=["lm_head"]), "target_modules: ['lm_head']"),
        (dict(peft_type="IA3"), "peft_type: 'IA3'"),
    ],
)
def test_a_config_kvserve_cannot_apply_is_refused_by_field(base, good, tmp_path, fields, words):
    loras = registry(base)
    loras.add(LoRARequest("kept", 1, str(good)))
    with pytest.raises(LoRAAdapterError) as e:
        loras.add(LoRARequest("bad", 2, str(edited(good, tmp_path, **fields))))
    assert "LoRA adapter 'bad'" in str(e.value) and words in str(e.value)
    assert list(loras.requests) == ["kept"] and list(loras.loaded) == ["kept"]


def test_a_rank_above_max_lora_rank_is_refused(base, good):
    with pytest.raises(LoRAAdapterError, match="r: rank 8 is above --max-lora-rank 4"):
        registry(base, max_rank=4).add(LoRARequest("a", 1, str(good)))


def test_a_missing_path_and_a_corrupt_file_are_refused_by_name(base, good, tmp_path):
    loras = registry(base)
    with pytest.raises(LoRAAdapterError, match="'gone': no such directory"):
        loras.add(LoRARequest("gone", 1, str(tmp_path / "nowhere")))
    corrupt = edited(good, tmp_path)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    unreadable = r"'broken': adapter_model\.safetensors is unreadable"
    with pytest.raises(LoRAAdapterError, match=unreadable):
        loras.add(LoRARequest("broken", 2, str(corrupt)))
    (corrupt / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoRAAdapterError, match=r"'broken': adapter_config\.json is unreadable"):
        loras.add(LoRARequest("broken", 2, str(corrupt)))
    assert loras.requests == {}


def test_an_adapter_of_another_base_model_is_refused_naming_the_tensor(base, tmp_path):
    family, overrides = FAMILIES["llama"]
    wider = build_checkpoint(family, tmp_path / "wider", **{**overrides, "hidden_size": 96})
    other = build_adapter(wider, tmp_path / "other", 8, seed=3)
    with pytest.raises(LoRAAdapterError) as e:
        registry(base).add(LoRARequest("other", 1, str(other)))
    assert "LoRA adapter 'other': tensor 'base_model.model.model.layers." in str(e.value)
    assert "is it this base model's adapter?" in str(e.value)


def test_one_name_from_two_paths_is_refused(base, good, tmp_path):
    loras = registry(base)
    loras.add(LoRARequest("a", 1, str(good)))
    loras.add(LoRARequest("a", 1, str(good)))  # the same again: nothing to do
    with pytest.raises(LoRAAdapterError, match="'a' is already loaded from"):
        loras.add(LoRARequest("a", 2, str(edited(good, tmp_path))))
