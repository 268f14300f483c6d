"""One request for ``n`` samples as ``n`` engine requests, and their outputs under its id.

Sample ``i`` of request ``R`` runs as the engine request ``f"{i}_{R}"`` (vLLM's naming) with
``n = 1`` and, when ``R`` has a seed, seed ``seed + i``: the samples differ, each is
reproducible. Its outputs go out as ``R``'s, each carrying that one sample's
``CompletionOutput`` with ``index = i``; ``finished`` is set on the output that ends the last
sample. With prefix caching on, samples 1..n-1 are held back until sample 0 has computed the
prompt (its first output), so that they start from its cached blocks instead of each
computing the prompt again.
"""

import dataclasses

from kvserve.engine.core.outputs import RequestOutput
from kvserve.engine.core.request import Request
from kvserve.engine.sampling_params import SamplingParams


def child_params(params: SamplingParams) -> list[SamplingParams]:
    """The ``n`` samples' parameters: ``n = 1`` each, seeds ``seed + i`` when seeded."""
    if params.seed is None:
        return [params.replace(n=1)] * params.n
    return [params.replace(n=1, seed=params.seed + i) for i in range(params.n)]


def child_id(request_id: str, index: int) -> str:
    return f"{index}_{request_id}"


class ParentRequest:
    """The samples of one request: which are unfinished, which are held back."""

    def __init__(self, request_id: str, children: list[Request], hold: bool) -> None:
        self.request_id = request_id
        self.children = children
        self.index = {c.request_id: i for i, c in enumerate(children)}
        self.unfinished = set(self.index)
        self.held = children[1:] if hold else []

    def release(self) -> list[Request]:
        """The held samples, once sample 0 has computed the prompt (or ended): they go to
        the scheduler now (but for any that failed while held). Empty while it has not, or
        once released."""
        leader = self.children[0]
        if not self.held or not (leader.num_outputs or leader.is_finished):
            return []
        released, self.held = self.held, []
        return [r for r in released if not r.is_finished]

    def relabel(self, output: RequestOutput) -> RequestOutput:
        """A sample's output as this request's: its completion's index set, ``finished``
        only when no sample is left running."""
        (completion,) = output.outputs
        if completion.finish_reason is not None:
            self.unfinished.discard(output.request_id)
        index = self.index[output.request_id]
        return dataclasses.replace(
            output,
            request_id=self.request_id,
            outputs=[dataclasses.replace(completion, index=index)],
            finished=not self.unfinished,
        )


class ParentRequests:
    """The engine's requests of ``n > 1`` samples, by their id and by their samples' ids."""

    def __init__(self) -> None:
        self._by_id: dict[str, ParentRequest] = {}
        self._by_child: dict[str, ParentRequest] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def add(self, parent: ParentRequest) -> None:
        self._by_id[parent.request_id] = parent
        self._by_child.update(dict.fromkeys(parent.index, parent))

    def pop(self, request_id: str) -> ParentRequest | None:
        """Forget a request (aborted or finished); None if it has no samples of its own."""
        parent = self._by_id.pop(request_id, None)
        if parent is not None:
            for child in parent.index:
                del self._by_child[child]
        return parent

    def is_held(self, request: Request) -> bool:
        parent = self._by_child.get(request.request_id)
        return parent is not None and request in parent.held

    def relabel(self, output: RequestOutput) -> RequestOutput:
        """A sample's output under its request's id (``ParentRequest.relabel``); any other
        output as it is."""
        parent = self._by_child.get(output.request_id)
        if parent is None:
            return output
        output = parent.relabel(output)
        if output.finished:
            self.pop(parent.request_id)
        return output

    def release(self) -> list[Request]:
        """Every held sample that may start now (``ParentRequest.release``)."""
        return [r for parent in self._by_id.values() for r in parent.release()]
