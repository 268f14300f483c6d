"""SmolLM2-135M-Instruct from its Q4_1 GGUF: the engine's greedy replies to chat prompts,
batched, are token for token transformers' in float32 (transformers loading the same GGUF)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvserve.engine.llm import LLM
from kvserve.engine.sampling_params import SamplingParams

from real_model import REAL_MODEL, requires_real_model

pytestmark = requires_real_model
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name the three primary colors."},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me one fact about octopuses."},
    ],
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def llm():
    assert REAL_MODEL is not None
    return LLM(str(REAL_MODEL), dtype="float32", num_kv_blocks=64, max_model_len=1024)


def test_greedy_chat_replies_are_transformers_own(llm):
    assert REAL_MODEL is not None
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
        for chat in CHATS
    ]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    got = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]
    model = AutoModelForCausalLM.from_pretrained(
        REAL_MODEL.parent, gguf_file=REAL_MODEL.name, dtype=torch.float32
    ).eval()
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
            )
        expected.append(out[0, len(prompt) :].tolist())
    assert got == expected
    first = tokenizer.decode(got[0])
    assert first.startswith("The capital of France is Paris.<|im_end|>"), first
