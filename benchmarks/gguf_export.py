"""A GGUF checkpoint written out as a Hugging Face directory (config.json, float32
safetensors, the tokenizer), for servers that do not read GGUF: vLLM's CPU build has no GGUF
loader. The weights are kvserve's own dequantization of the file (``GGUFTensors``), so both
servers compute with exactly the weights kvserve serves from the GGUF itself."""

import json
from pathlib import Path

from safetensors.torch import save_file

from kvserve.engine.models.gguf_checkpoint import GGUFTensors, gguf_config
from kvserve.engine.tokenizer import load_tokenizer

MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def export(gguf: Path, directory: Path) -> Path:
    """`directory` (made here) holding `gguf`'s model in float32."""
    directory.mkdir(parents=True)
    config = gguf_config(gguf)
    config |= {"model_type": MODEL_TYPES[config["architectures"][0]], "torch_dtype": "float32"}
    with GGUFTensors(gguf) as tensors:
        names = tensors.keys()  # a list: GGUFTensors is not iterable
        weights = {name: tensors.get_tensor(name).contiguous() for name in names}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    load_tokenizer(str(gguf)).save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
