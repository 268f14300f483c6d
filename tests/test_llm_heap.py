"""``LLM.generate`` keeps the objects that were there before it out of the garbage
collector's reach while the engine runs, and gives them back after; a caller's own freeze
stays as it was."""

import gc

import pytest

from kvserve import LLM
from kvserve.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


class Node:
    """A tracked object."""


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint("llama")), num_kv_blocks=64)


def frozen_during_steps(llm: LLM, monkeypatch) -> list[tuple[int, bool]]:
    """Per step: the freeze count, and whether an object made before generate was tracked."""
    before, seen = Node(), []
    step = llm.engine.step

    def observed_step():
        seen.append((gc.get_freeze_count(), any(o is before for o in gc.get_objects())))
        return step()

    monkeypatch.setattr(llm.engine, "step", observed_step)
    llm.generate([5, 9, 33], PARAMS)
    return seen


def test_generate_freezes_the_heap_while_it_steps_and_unfreezes_it_after(llm, monkeypatch):
    assert gc.get_freeze_count() == 0
    seen = frozen_during_steps(llm, monkeypatch)
    assert len(seen) == 4
    assert all(count > 1000 and not tracked for count, tracked in seen)
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_as_it_is(llm, monkeypatch):
    """generate freezes nothing more (objects made since the caller's freeze stay
    tracked) and unfreezes nothing of the caller's."""
    callers = Node()
    gc.freeze()
    try:
        seen = frozen_during_steps(llm, monkeypatch)
        assert len(seen) == 4 and all(tracked for _, tracked in seen)
        assert gc.get_freeze_count() > 1000
        assert not any(o is callers for o in gc.get_objects())
    finally:
        gc.unfreeze()
