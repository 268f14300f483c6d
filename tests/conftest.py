import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch

# Triton reads TRITON_INTERPRET when it decorates a kernel (when the kernel module is first
# imported), and pytest imports every test module into one process: the switch must be on
# before collection for the Triton kernels to run on CPU tensors. With CUDA they compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny models gain nothing from a second thread, and OpenMP's spinning threads slow to a
# crawl when the cores are shared (tens of times slower, measured): one thread here and in
# every server process the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import FAMILIES, MOE_FAMILIES, build_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """``checkpoint(name)`` → the directory of the tiny checkpoint ``name`` (built once)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            family, overrides = (FAMILIES | MOE_FAMILIES)[name]
            built[name] = build_checkpoint(family, tmp_path_factory.mktemp(name), **overrides)
        return built[name]

    return get


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def scheduling(request):
    """Run a module's tests twice: every ``LLMEngine`` they build, and every server process
    they start (``KVSERVE_ASYNC_SCHEDULING``), with async scheduling off, then on; the value
    is whether it is on. A module opts in with ``pytestmark =
    pytest.mark.usefixtures("scheduling")``; its module-scoped fixtures that build an engine
    or start a server take ``scheduling`` as an argument, so that they are built for each."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param:
            from kvserve.engine.llm_engine import LLMEngine

            build = LLMEngine.__init__

            def build_async(self, config, *args, **kwargs):
                config = dataclasses.replace(config, async_scheduling=True)
                build(self, config, *args, **kwargs)

            patch.setattr(LLMEngine, "__init__", build_async)
            patch.setenv("KVSERVE_ASYNC_SCHEDULING", "true")
        yield request.param


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module", params=[None, "ngram"], ids=["no-spec", "ngram"])
def speculation(request, scheduling):
    """Run a module's tests also with n-gram speculative decoding (``NGRAM``) in every
    ``LLMEngine`` they build and every server they start (``KVSERVE_SPECULATIVE_CONFIG``):
    greedy and seeded outputs must not change. Not beside async scheduling, which it turns
    off (those runs would repeat the synchronous ones). Opted in like ``scheduling``; the
    value is the method, or None."""
    if request.param is not None and scheduling:
        pytest.skip("speculative decoding turns async scheduling off")
    with pytest.MonkeyPatch.context() as patch:
        if request.param is not None:
            from kvserve.engine.llm_engine import LLMEngine

            build = LLMEngine.__init__

            def build_speculating(self, config, *args, **kwargs):
                config = dataclasses.replace(config, speculative_config=NGRAM)
                build(self, config, *args, **kwargs)

            patch.setattr(LLMEngine, "__init__", build_speculating)
            patch.setenv("KVSERVE_SPECULATIVE_CONFIG", json.dumps(NGRAM))
        yield request.param
