"""moe_align: slots sorted by expert and padded per expert to the row block, on a routing
written out by hand and on random ones (each slot exactly once, blocks of one expert,
padding marked)."""

import pytest
import torch

from kvserve.engine.kernels.moe_align import alignment_capacity, moe_align


def test_a_small_routing_sorts_and_pads_each_expert_to_the_block():
    # slots: token 0 → experts 2, 0; token 1 → 2, 3; token 2 → 2, 0 (expert 1 gets none)
    ids = torch.tensor([[2, 0], [2, 3], [2, 0]], dtype=torch.int32)
    sorted_slots, block_experts, padded_count = moe_align(ids, num_experts=4, block_m=2)
    pad = 6
    assert padded_count.tolist() == [8]  # expert 0: 2 slots, 2: 3 → 4, 3: 1 → 2
    assert alignment_capacity(6, 4, 2) == 10
    assert sorted_slots.tolist() == [1, 5, 0, 2, 4, pad, 3, pad, pad, pad]
    assert block_experts.tolist() == [0, 2, 2, 3, -1]
    assert (sorted_slots.dtype, block_experts.dtype, padded_count.dtype) == (torch.int32,) * 3


@pytest.mark.parametrize(
    ("tokens", "top_k", "num_experts", "block_m"),
    [(1, 1, 8, 16), (1, 4, 8, 16), (37, 3, 5, 4), (200, 2, 3, 16), (9, 6, 64, 8)],
)
def test_each_slot_once_blocks_of_one_expert_and_padding_marked(
    tokens, top_k, num_experts, block_m
):
    generator = torch.Generator().manual_seed(tokens * 100 + top_k)
    ids = torch.stack(
        [torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(tokens)]
    )
    ids[ids == 0] = 1  # expert 0 gets no tokens (a token may now pick 1 twice: still valid)
    slots = tokens * top_k
    sorted_slots, block_experts, padded_count = moe_align(ids, num_experts, block_m)
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    assert padded_count.item() == int(((counts + block_m - 1) // block_m * block_m).sum())
    assert sorted_slots.numel() == alignment_capacity(slots, num_experts, block_m)
    real = sorted_slots[sorted_slots != slots]
    assert sorted(real.tolist()) == list(range(slots))  # every slot exactly once
    assert (sorted_slots[padded_count.item() :] == slots).all()  # past the count: padding
    flat = ids.flatten()
    for block, expert in enumerate(block_experts.tolist()):
        rows = sorted_slots[block * block_m : (block + 1) * block_m]
        members = rows[rows != slots].long()
        if block * block_m >= padded_count.item():
            assert expert == -1
            continue
        assert members.numel() > 0  # a padded block always starts with a real slot
        assert (flat[members] == expert).all()
        assert members.tolist() == sorted(members.tolist())
        rows_left = rows.tolist()
        assert rows_left[: members.numel()] == members.tolist()  # padding only at the end
    assert 0 not in block_experts.tolist()


def test_bad_routing_is_named():
    with pytest.raises(ValueError, match="topk_ids must be an integer"):
        moe_align(torch.zeros(3, 2), 4, 16)
    with pytest.raises(ValueError, match="topk_ids must be an integer"):
        moe_align(torch.zeros(6, dtype=torch.int32), 4, 16)
    with pytest.raises(ValueError, match="num_experts and block_m"):
        moe_align(torch.zeros(3, 2, dtype=torch.int32), 0, 16)
