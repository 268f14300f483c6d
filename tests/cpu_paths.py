"""The CPU kernels' SIMD paths as pytest parameters; those this CPU cannot run are skipped."""

import pytest

from kvserve.engine import cpu_library

ISA_PARAMS = [
    pytest.param(
        isa,
        id=isa,
        marks=pytest.mark.skipif(
            isa not in cpu_library.supported_isas(), reason=f"this CPU has no {isa}"
        ),
    )
    for isa in cpu_library.ISAS
]
