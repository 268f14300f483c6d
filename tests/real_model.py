"""The tests' real tier: SmolLM2-135M-Instruct, the default model, once fetched into the cache
(``make test`` fetches it, and CI runs ``make test``); its tests skip, saying so, without it."""

import pytest

from kvserve.server import smollm2

REAL_MODEL = smollm2.cached()
SERVED_NAME = smollm2.SERVED_NAME
requires_real_model = pytest.mark.skipif(
    REAL_MODEL is None,
    reason=f"SmolLM2-135M-Instruct is not fetched into {smollm2.model_path().parent} "
    "(`python -m kvserve.server.smollm2` fetches it; make test does)",
)
