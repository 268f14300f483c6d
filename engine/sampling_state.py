"""Each request's sampling history on the device: what penalties and ``min_tokens`` read, so
that sampling never needs the previous step's token on the host."""

from dataclasses import dataclass

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device
from kvserve.engine.sampling_rows import ParamRows, StepParams

NULL_SLOT = 0  # the row of every request that keeps no history: always zero, never written
SLOT_CHUNK = 16  # the state grows by this many slots at a time


def keeps_history(request: Request) -> bool:
    """Whether sampling ``request`` reads its history: a presence, frequency or repetition
    penalty, or ``min_tokens`` (not for a constrained request: its grammar decides where EOS
    may come)."""
    p = request.params
    return (
        bool(p.presence_penalty or p.frequency_penalty)
        or p.repetition_penalty != 1
        or (p.min_tokens > 0 and request.grammar is None)
    )


@dataclass(frozen=True)
class SlotInit:
    """A slot's row as its new owner starts it: its prompt's tokens (only where a repetition
    penalty reads them) and the outputs it already has (a request resumed after a
    preemption)."""

    slot: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]


class SamplingState:
    """Per-slot rows on the device: ``counts[slot, token]`` (float32, exact below 2**24, the
    logits' dtype so that penalties read it as it is), how often the slot's
    request output ``token``; ``prompt_seen[slot, token]`` (bool), whether its prompt holds
    it; ``num_outputs[slot]`` (int32), its output count. Slot ``NULL_SLOT`` stays zero for
    the requests that keep no history (``keeps_history``).

    Memory: ``vocab * 5 + 4`` bytes a slot, for the most requests that kept a history at
    once and the null slot, rounded up to a multiple of ``SLOT_CHUNK`` (none: nothing
    allocated). 64 penalised requests on a 128,256-token vocabulary (Llama 3): 80 slots,
    51 MB; 256: 272 slots, 174 MB.

    Every request that samples also holds a row of ``params`` (``ParamRows``: its sampling
    parameters, written once), handed out and given back with its slot.

    Threads: slots are handed out (``rows``) and given back (``free``, when the request
    finishes, is aborted or preempted) on the engine thread; the tensors are written only
    by ``StepRows``, where the step samples (the step thread under async scheduling), one
    step after the other. So a slot given back while a step in flight still writes its old
    owner's token is set for its new owner by a later step, after that write; a preempted
    request gets a new slot, set from its tokens on the host, when it samples again.
    """

    def __init__(self) -> None:
        # by request id: its row of params, its slot, whether it samples greedily
        self._held: dict[str, tuple[int, int, bool]] = {}
        self._free: list[int] = []
        self._next = NULL_SLOT + 1
        self.params = ParamRows()
        self.counts: torch.Tensor | None = None
        self.prompt_seen: torch.Tensor | None = None
        self.num_outputs: torch.Tensor | None = None

    @property
    def num_held(self) -> int:
        """Slots held by requests now."""
        return sum(slot != NULL_SLOT for _, slot, _ in self._held.values())

    def slot_of(self, request: Request) -> int | None:
        held = self._held.get(request.request_id)
        return None if held is None or held[1] == NULL_SLOT else held[1]

    def rows(self, requests: list[Request]) -> "StepRows":
        """The slot and row of ``params`` of each of ``requests`` (a sampling call's rows, in
        order), handed out to a request that holds none yet: a row of ``params`` to each,
        and a slot to each that keeps a history, set from its tokens on the host (all
        there: a request starts sampling with no token in flight)."""
        param_rows: list[int] = []
        slots: list[int] = []
        inits: list[SlotInit] = []
        greedy = True
        for request in requests:
            held = self._held.get(request.request_id)
            if held is None:
                held = self._hold(request, inits)
            param_rows.append(held[0])
            slots.append(held[1])
            greedy = greedy and held[2]
        return StepRows(self, slots, inits, self.params.step(param_rows, greedy))

    def _hold(self, request: Request, inits: list[SlotInit]) -> tuple[int, int, bool]:
        """A row of ``params`` for ``request``, and a slot if it keeps a history (its init
        added to ``inits``)."""
        slot = NULL_SLOT
        if keeps_history(request):
            if request.num_output_placeholders:
                raise RuntimeError(
                    f"request {request.request_id} takes a sampling slot with tokens in flight"
                )
            slot = self._free.pop() if self._free else self._take_new()
            seen = request.prompt_token_ids if request.params.repetition_penalty != 1 else []
            inits.append(SlotInit(slot, list(seen), request.output_token_ids))
        row = self.params.take(request.params)
        held = self._held[request.request_id] = (row, slot, request.params.greedy)
        return held

    def free(self, request: Request) -> None:
        """``request`` no longer runs: its row of ``params`` and its slot, if any, go back."""
        held = self._held.pop(request.request_id, None)
        if held is not None:
            self.params.give_back(held[0])
            if held[1] != NULL_SLOT:
                self._free.append(held[1])

    def _take_new(self) -> int:
        slot, self._next = self._next, self._next + 1
        return slot

    def reserve(self, num_slots: int, vocab: int, device: torch.device) -> None:
        """Rows for slots ``0..num_slots-1`` at least (a multiple of ``SLOT_CHUNK``), keeping
        the rows held."""
        have = 0 if self.counts is None else self.counts.shape[0]
        if self.counts is not None and self.counts.shape[1] != vocab:
            width = self.counts.shape[1]
            raise ValueError(f"logits of {vocab} columns against a history of {width}")
        if num_slots <= have:
            return
        size = -(-num_slots // SLOT_CHUNK) * SLOT_CHUNK
        counts = torch.zeros(size, vocab, dtype=torch.float32, device=device)
        seen = torch.zeros(size, vocab, dtype=torch.bool, device=device)
        outputs = torch.zeros(size, dtype=torch.int32, device=device)
        if self.counts is not None:
            assert self.prompt_seen is not None and self.num_outputs is not None
            counts[:have], seen[:have] = self.counts, self.prompt_seen
            outputs[:have] = self.num_outputs
        self.counts, self.prompt_seen, self.num_outputs = counts, seen, outputs


class StepRows:
    """A sampling call's rows of a ``SamplingState``: built on the engine thread
    (``SamplingState.rows``), read and written where the call samples. The first read sets
    the rows of the slots handed out for it; ``record`` adds the sampled tokens, once the
    call can no longer fail. ``params``: the rows' sampling parameters."""

    def __init__(
        self, state: SamplingState, slots: list[int], inits: list[SlotInit], params: StepParams
    ) -> None:
        self.state = state
        self.slots = slots
        self.inits = inits
        self.params = params
        self._index: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._present: torch.Tensor | None = None

    def row(self, i: int) -> "StepRows":
        """Row ``i`` alone (a batch sampled again row by row)."""
        slot = self.slots[i]
        inits = [init for init in self.inits if init.slot == slot]
        return StepRows(self.state, [slot], inits, self.params.row(i))

    def counts(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's output-token counts, float32 ``[rows, vocab]``."""
        if self._counts is None:
            self._counts = self._gather(logits, 0)
        return self._counts

    def present(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's tokens in its output, bool ``[rows, vocab]``."""
        if self._present is None:
            self._present = self.counts(logits) > 0
        return self._present

    def seen(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's tokens in its prompt (as its slot's init gave them) or output, bool."""
        return self._gather(logits, 1) | self.present(logits)

    def num_outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's output count, int32 ``[rows]``."""
        return self._gather(logits, 2)

    def _gather(self, logits: torch.Tensor, which: int) -> torch.Tensor:
        return self._tensors(logits)[which].index_select(0, self._slot_index(logits.device))

    def record(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count ``tokens`` (one per row of ``logits``, on the device) in the rows that keep
        a history."""
        kept = [i for i, slot in enumerate(self.slots) if slot != NULL_SLOT]
        if not kept:
            return
        counts, _, outputs = self._tensors(logits)
        device = logits.device
        slots = to_device([self.slots[i] for i in kept], device, torch.long)
        ones = torch.ones(len(kept), dtype=torch.int32, device=device)
        taken = tokens[to_device(kept, device, torch.long)]
        counts.index_put_((slots, taken), ones.to(counts.dtype), accumulate=True)
        outputs.index_put_((slots,), ones, accumulate=True)

    def _slot_index(self, device: torch.device) -> torch.Tensor:
        if self._index is None:
            self._index = to_device(self.slots, device, torch.long)
        return self._index

    def _tensors(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The state's tensors, sized for this call's slots, its inits applied (once)."""
        state = self.state
        if self.inits or state.counts is None or state.counts.shape[0] <= max(self.slots):
            state.reserve(max(self.slots) + 1, logits.shape[1], logits.device)
            self._apply_inits(logits.device)
        assert state.counts is not None and state.prompt_seen is not None
        assert state.num_outputs is not None
        return state.counts, state.prompt_seen, state.num_outputs

    def _apply_inits(self, device: torch.device) -> None:
        state, inits = self.state, self.inits
        self.inits = []
        if not inits:
            return
        assert state.counts is not None and state.prompt_seen is not None
        assert state.num_outputs is not None
        slots = to_device([init.slot for init in inits], device, torch.long)
        state.counts[slots] = 0
        state.prompt_seen[slots] = False
        state.num_outputs[slots] = to_device(
            [len(init.output_token_ids) for init in inits], device, torch.int32
        )
        for tensor, ids, value in (
            (state.counts, [init.output_token_ids for init in inits], 1),
            (state.prompt_seen, [init.prompt_token_ids for init in inits], True),
        ):
            rows = [init.slot for init, row in zip(inits, ids, strict=True) for _ in row]
            if rows:
                cols = [token for row in ids for token in row]
                index = (to_device(rows, device, torch.long), to_device(cols, device, torch.long))
                values = torch.full((len(rows),), value, dtype=tensor.dtype, device=device)
                tensor.index_put_(index, values, accumulate=tensor.dtype != torch.bool)
        self._counts = self._present = None
