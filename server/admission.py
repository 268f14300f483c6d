"""Admission against ``--max-waiting-requests``, counted in engine requests.

One API request becomes ``n × prompts`` engine requests. The batch runs up to
``max_num_seqs`` of them at once; the rest wait. An API request is admitted only if,
with all of its engine requests added, at most ``limit`` would be waiting:
``unfinished + new <= max_num_seqs + limit``. The check and the reservation are one
step on the event loop, so a burst cannot slip past the limit, and an engine request
counts from its admission until it finishes (or is aborted), not only once the engine
has taken it. One that can never fit (more engine requests than the batch and the
queue hold) is a 400: retrying it cannot help.
"""

from kvserve.server.errors import bad_request, unavailable


class Reservation:
    """Engine requests of one API request, held until each is done."""

    def __init__(self, admission: "Admission", count: int) -> None:
        self._admission = admission
        self._held = set(range(count))

    def done(self, index: int) -> None:
        """Engine request ``index`` finished: its place is free."""
        if index in self._held:
            self._held.discard(index)
            self._admission.unfinished -= 1

    def close(self) -> None:
        for index in list(self._held):
            self.done(index)

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Admission:
    def __init__(self, limit: int | None, batch: int) -> None:
        self.limit = limit
        self.batch = batch
        self.unfinished = 0  # engine requests admitted and not done

    @property
    def capacity(self) -> int | None:
        return None if self.limit is None else self.batch + self.limit

    def reserve(self, count: int, param: str) -> Reservation:
        """Reserve ``count`` engine requests; 503 if that overfills the queue now, 400
        (naming ``param``) if it always would."""
        capacity = self.capacity
        if capacity is not None and count > capacity:
            raise bad_request(
                f"this request needs {count} sequences but the server runs {self.batch} "
                f"and queues {self.limit}; send fewer prompts or a smaller 'n'",
                param,
            )
        if capacity is not None and self.unfinished + count > capacity:
            raise unavailable(
                f"the server is at capacity ({self.limit} requests waiting); retry later",
                code="server_overloaded",
            )
        self.unfinished += count
        return Reservation(self, count)
