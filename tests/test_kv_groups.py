"""Layers grouped by the memory they keep: equal groups over one pool of pages."""

import pytest

from kvserve.engine.core.kv_groups import (
    FULL,
    LINEAR,
    SHARED,
    SLIDING,
    KVGroup,
    LayerKind,
    group_size,
    kv_groups,
    page_elements,
)

F, S, L = LayerKind(FULL), LayerKind(SLIDING, 8), LayerKind(LINEAR)


def test_a_dense_model_is_one_group_of_all_its_layers():
    groups = kv_groups([F] * 4)
    assert groups == (KVGroup(FULL, None, (0, 1, 2, 3)),)
    assert group_size(groups) == 4


def test_kinds_are_cut_into_groups_the_size_of_the_smallest_kind_full_attention_first():
    groups = kv_groups([S, S, F, S, S, F, S])
    assert groups == (
        KVGroup(FULL, None, (2, 5)),
        KVGroup(SLIDING, 8, (0, 1)),
        KVGroup(SLIDING, 8, (3, 4)),
        KVGroup(SLIDING, 8, (6,)),
    )
    assert group_size(groups) == 2


def test_linear_layers_keep_no_blocks_and_different_windows_are_different_groups():
    groups = kv_groups([L, LayerKind(SLIDING, 4), L, S])
    assert groups == (KVGroup(SLIDING, 4, (1,)), KVGroup(SLIDING, 8, (3,)))


def test_kv_shared_layers_keep_no_blocks_and_do_not_size_the_groups():
    groups = kv_groups([S, S, F, LayerKind(SHARED), LayerKind(SHARED)])
    assert groups == (
        KVGroup(FULL, None, (2,)),
        KVGroup(SLIDING, 8, (0,)),
        KVGroup(SLIDING, 8, (1,)),
    )
    assert group_size(groups) == 1


def test_layers_of_several_shapes_fill_pages_of_equal_bytes():
    """Gemma-4-31B-shaped: 50 sliding layers of 16 kv heads x 256, 10 global of 4 x 512 (half
    the elements): a page holds 5 sliding layers or all 10 global ones."""
    sliding, full = LayerKind(SLIDING, 1024, 16 * 256), LayerKind(FULL, None, 4 * 512)
    kinds = ([sliding] * 5 + [full]) * 10
    groups = kv_groups(kinds)
    assert groups[0] == KVGroup(FULL, None, tuple(range(5, 60, 6)), 2048)
    assert [len(g.layers) for g in groups] == [10] + [5] * 10
    assert groups[1] == KVGroup(SLIDING, 1024, (0, 1, 2, 3, 4), 4096)
    assert page_elements(groups) == 5 * 4096 == 10 * 2048


def test_a_query_skips_the_blocks_wholly_before_its_window():
    group = KVGroup(SLIDING, 6, (0,))
    # a query at position p reads keys p-5..p: with blocks of 4, p=13 reads 8..13
    assert [group.blocks_skipped(p, 4) for p in (4, 8, 9, 12, 13, 16, 17)] == [0, 0, 1, 1, 2, 2, 3]
    assert KVGroup(FULL, None, (0,)).blocks_skipped(1000, 4) == 0


@pytest.mark.parametrize(
    ("kind", "window", "message"),
    [
        ("cross_attention", None, "layer kind"),
        (SLIDING, None, "needs a window"),
        (FULL, 4, "has no window"),
    ],
)
def test_a_bad_layer_kind_names_what_is_wrong(kind, window, message):
    with pytest.raises(ValueError, match=message):
        LayerKind(kind, window)
