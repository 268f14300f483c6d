"""The engine's outputs are deltas; tests that read a request's whole output so far join
them here, with the engine's own ``join_outputs``."""

from collections.abc import Iterable

from kvserve.engine.core.outputs import RequestOutput, join_outputs


class JoinedOutputs:
    """Every delta seen, per request."""

    def __init__(self) -> None:
        self.deltas: dict[str, list[RequestOutput]] = {}

    def add(self, outputs: Iterable[RequestOutput]) -> list[RequestOutput]:
        """Take a step's outputs; each of their requests' output so far, in their order."""
        outputs = list(outputs)
        for output in outputs:
            self.deltas.setdefault(output.request_id, []).append(output)
        return [join_outputs(self.deltas[o.request_id]) for o in outputs]
