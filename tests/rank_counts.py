"""The tensor-parallel rank counts the engine, server, structured-output and fuzz suites run
with (a module of its own: ``conftest`` names several modules once tests/e2e is collected)."""

TENSOR_PARALLEL = (1, 2)
TENSOR_PARALLEL_IDS = ("tp1", "tp2")
