"""The server freezes its start-up heap: the garbage collector's full collections then scan
only what serving made, not the modules, model and app (a 180-200 ms stall of every stream
each time, unfrozen)."""

import re

from server_process import ServerProcess


def test_serve_freezes_its_heap_once_loaded_and_frees_it_at_exit(checkpoint, tmp_path):
    with ServerProcess(checkpoint("llama"), log=tmp_path / "server.log") as server:
        pass
    assert server.process is not None and server.process.returncode == 0
    log = server.log.read_text()
    frozen = re.findall(r"INFO kvserve\.server: (\d+) start-up objects frozen out of the", log)
    assert len(frozen) == 1 and int(frozen[0]) > 100_000, log
    assert log.index("frozen out of the garbage collector") < log.index("serving tiny on http")
    assert "leaked" not in log, log  # unfrozen at shutdown, everything is freed
