"""A worker moves a step's inputs to its rank's device: every tensor of every layer's
metadata, each shared metadata object once (``worker._to``). Checked on torch's ``meta``
device, which any machine has."""

import torch

from kvserve.engine.executor.model_runner import StepInputs
from kvserve.engine.executor.worker import _to
from kvserve.engine.layers.linear_attention.metadata import StateMetadata

from sharded_steps import meta


def _inputs(step_meta) -> StepInputs:
    return StepInputs(
        input_ids=torch.tensor([5, 9, 33]),
        positions=torch.tensor([0, 1, 2]),
        meta=step_meta,
        logits_indices=torch.tensor([2]),
        every_row=False,
    )


def _tensors(obj) -> list[torch.Tensor]:
    return [v for v in vars(obj).values() if isinstance(v, torch.Tensor)]


def test_one_metadata_for_every_layer_moves_whole():
    inputs = _to(_inputs(meta([0], [3])), torch.device("meta"))
    assert all(t.is_meta for t in _tensors(inputs.meta) + _tensors(inputs))


def test_per_layer_metadata_moves_each_group_once_and_stays_shared():
    full, window = meta([0], [3]), meta([0], [3])
    state = StateMetadata(
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        state_slots=torch.tensor([1], dtype=torch.int32),
        has_initial_state=torch.tensor([False]),
        query_start_loc_host=[0, 3],
    )
    inputs = _to(_inputs([full, window, state, full, window, state]), torch.device("meta"))
    layers = inputs.meta
    assert isinstance(layers, list)
    assert layers[0] is layers[3] and layers[1] is layers[4] and layers[2] is layers[5]
    for group in layers[:3]:
        assert _tensors(group) and all(t.is_meta for t in _tensors(group)), group
    assert layers[2].query_start_loc_host == [0, 3]  # host lists stay on the host
