"""Admission: engine requests reserved per HTTP request; a full queue is 503, too many 400."""

import pytest

from kvserve.server.admission import Admission
from kvserve.server.errors import APIError


def test_admission_reserves_engine_requests_until_each_is_done():
    admission = Admission(limit=2, batch=4)
    first = admission.reserve(6, "n")  # 4 run, 2 wait
    with pytest.raises(APIError) as full:
        admission.reserve(1, "prompt")
    assert (full.value.status, full.value.headers) == (503, {"Retry-After": "1"})
    assert full.value.code == "server_overloaded"
    first.done(0)
    first.done(0)  # once only
    second = admission.reserve(1, "prompt")
    assert admission.unfinished == 6
    first.close()
    second.close()
    assert admission.unfinished == 0
    with pytest.raises(APIError) as never:
        admission.reserve(7, "n")
    assert (never.value.status, never.value.param) == (400, "n")
    assert Admission(limit=None, batch=1).reserve(1000, "n") is not None
