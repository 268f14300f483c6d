"""Recurrent-state slots: one fixed-size state per running request of a linear-attention model."""

from collections import deque


class StateSlots:
    """Slot indices ``0..num_slots-1`` into a model's per-request state tensors (the
    recurrent and convolution states of its linear-attention layers).

    Invariant: a slot is in the free queue exactly when no request holds it; a request holds
    at most one, from its admission to its finish or preemption (a preempted request
    recomputes its state from its tokens, as it recomputes its KV). Slots are handed out
    least recently freed first.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_state_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free = deque(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def free_slots(self) -> list[int]:
        return list(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_slots

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free state slot")
        return self._free.popleft()

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise RuntimeError(f"state slot {slot} freed but not held")
        self._free.append(slot)
