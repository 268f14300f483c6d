"""``frozen_heap`` keeps the objects alive at its start out of the garbage collector's
reach for its block and gives them back after; a caller's own freeze stays as it was."""

import gc
import weakref

from kvserve.engine.frozen_heap import frozen_heap


class Node:
    """A tracked object."""


def test_the_heap_is_out_of_the_collectors_reach_in_the_block_and_back_after():
    before, tracked = Node(), len(gc.get_objects())
    with frozen_heap():
        after = Node()
        unfrozen = gc.get_objects()
        assert gc.get_freeze_count() >= tracked // 2
        assert not any(o is before for o in unfrozen)
        assert any(o is after for o in unfrozen)
        assert len(unfrozen) < 1000
    assert gc.get_freeze_count() == 0
    assert any(o is before for o in gc.get_objects())


def garbage_cycle() -> weakref.ref:
    """A weak reference to a reference cycle nothing else holds: garbage that only a
    collection frees."""
    cycle = Node()
    cycle.self = cycle
    return weakref.ref(cycle)


def test_collect_frees_the_garbage_before_freezing_it():
    """Frozen garbage outlives the block's collections; collected first, it is gone."""
    gc.disable()
    try:
        for collect in (False, True):
            ref = garbage_cycle()
            with frozen_heap(collect=collect):
                gc.collect()
                assert (ref() is None) is collect
    finally:
        gc.enable()
    gc.collect()


def test_the_heap_is_unfrozen_when_the_block_raises():
    try:
        with frozen_heap():
            raise RuntimeError("stop")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_as_it_is():
    callers = Node()
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with frozen_heap(collect=True):
            later = Node()
            assert gc.get_freeze_count() == count
            assert any(o is later for o in gc.get_objects())
        assert gc.get_freeze_count() == count
        assert not any(o is callers for o in gc.get_objects())
    finally:
        gc.unfreeze()
