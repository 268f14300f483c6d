"""Each output of a running request carries only what is new since the previous one; the
deltas join to the offline (complete) output, and streamed text pieces to the whole text."""

import pytest

from kvserve import LLM
from kvserve.engine.core.outputs import RequestOutput, join_outputs
from kvserve.engine.sampling_params import SamplingParams

from reference import hf_greedy

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPT = [5, 9, 33, 70, 12, 41]


@pytest.fixture(scope="module")
def llm(checkpoint, scheduling):
    return LLM(str(checkpoint("llama")), num_kv_blocks=64)


def deltas(llm: LLM, prompt: list[int] | str, params: SamplingParams) -> list[RequestOutput]:
    engine = llm.engine
    engine.add_request("d", prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs


def test_each_output_holds_its_new_token_and_logprob_and_the_deltas_join_to_the_offline_output(
    llm, checkpoint
):
    params = SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    outputs = deltas(llm, PROMPT, params)
    expected = hf_greedy(str(checkpoint("llama")), PROMPT, 8)
    completions = [o.outputs[0] for o in outputs]
    assert [c.token_ids for c in completions] == [[t] for t in expected]
    assert [c.num_output_tokens for c in completions] == list(range(1, 9))
    assert [[lp.token_id for lp in c.logprobs] for c in completions] == [[t] for t in expected]
    assert [o.finished for o in outputs] == [False] * 7 + [True]
    assert [c.finish_reason for c in completions] == [None] * 7 + ["length"]
    assert len(outputs[0].prompt_logprobs) == len(PROMPT)
    assert [o.prompt_logprobs for o in outputs[1:]] == [None] * 7
    offline = llm.generate(PROMPT, params)[0]
    joined = join_outputs(outputs)
    assert joined.outputs[0].token_ids == offline.outputs[0].token_ids == expected
    assert joined.outputs[0].text == offline.outputs[0].text == "".join(c.text for c in completions)
    assert joined.outputs[0].logprobs == offline.outputs[0].logprobs
    assert joined.prompt_logprobs == offline.prompt_logprobs


def test_streamed_text_pieces_join_to_the_whole_text_cut_before_a_stop_string(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    full = llm.generate("def split(text, sep):", greedy)[0].outputs[0]
    tokenizer = llm.get_tokenizer()
    head = len(tokenizer.decode(full.token_ids[:5]))
    stop = full.text[head - 2 : head + 2]  # spans the fifth and sixth tokens
    index = full.text.index(stop)
    stopped = greedy.replace(stop=(stop, "@@@@@@"))  # the longer one holds 5 characters back
    outputs = deltas(llm, "def split(text, sep):", stopped)
    pieces = [o.outputs[0].text for o in outputs]
    assert (
        "".join(pieces)
        == full.text[:index]
        == llm.generate("def split(text, sep):", stopped)[0].outputs[0].text
    )
    assert (outputs[-1].outputs[0].finish_reason, outputs[-1].outputs[0].stop_reason) == (
        "stop",
        stop,
    )
    assert all(stop not in piece for piece in pieces)
    assert pieces[0] == ""  # the first token's text is held back: a stop could start in it
