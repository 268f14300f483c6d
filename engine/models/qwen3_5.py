"""Qwen3.5 (dense): Qwen3-Next's hybrid decoder (``qwen3_next.py``) with separate q/k/v, z, b
and a projections in its Gated DeltaNets (``layout`` ``qwen3_5``) and a dense MLP in every
layer. Its RoPE is multimodal (one rotation per axis of time, height and width); a text
position is the same on every axis, so for text it is partial RoPE. The published
checkpoints are image-text ones (``Qwen3_5ForConditionalGeneration``): their language model
is served, their vision tower skipped."""

import re

from kvserve.engine.models.qwen3_next import Qwen3NextForCausalLM

_LANGUAGE_MODEL = re.compile(r"^model\.language_model\.")
_OTHER_MODALITIES = re.compile(r"^(?:model\.visual|mtp)\.")


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    pass


def language_model_name(name: str) -> str | None:
    """An image-text checkpoint's tensor name as a text-only checkpoint spells it; None for
    the vision tower's and the multi-token-prediction layer's."""
    if _OTHER_MODALITIES.match(name):
        return None
    return _LANGUAGE_MODEL.sub("model.", name)


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The language model of a Qwen3.5 image-text checkpoint."""

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
