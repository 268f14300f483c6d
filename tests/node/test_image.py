"""The serving image as scripts/build-image.sh exports it (a docker-archive), read offline.

The pods need: a numeric non-root user (runAsNonRoot checks it without /etc/passwd), HOME on
the /tmp emptyDir (the root filesystem is read-only), the demo model at the path the README
and the samples name, SmolLM2-135M-Instruct's GGUF where `kvserve serve` with no model finds
it, and the CPU kernels' library prebuilt (for every x86-64 CPU: it picks its SIMD path at
run time), because the image has no compiler. The module fixture builds the
image first (cached: the e2e scenarios' fixture builds the same one). KVSERVE_SKIP_E2E=1 skips
these tests, as the scenarios, and so does a user other than root (the build needs root).
"""

import hashlib
import json
import os
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from k8s.support import BUILD_TIMEOUT, build_image

from kvserve.engine.kernels import cpu_library
from kvserve.server import smollm2
from kvserve.server.cli import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 300)  # the first test's setup may build it cold
KERNEL_DIR = "/opt/kvserve/kernels"
DEMO = "/opt/kvserve/models/demo"
SMOLLM2 = f"/opt/kvserve/models/{smollm2.SERVED_NAME}"

if os.environ.get("KVSERVE_SKIP_E2E") == "1":
    pytest.skip("KVSERVE_SKIP_E2E=1: the image tests are skipped", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("building the image needs root (mmdebstrap, buildah)", allow_module_level=True)


@dataclass(frozen=True)
class Entry:
    type: bytes
    size: int
    linkname: str
    data: bytes | None  # read only for the few files the tests compare


@dataclass(frozen=True)
class Image:
    repo_tags: list[str]
    config: dict
    files: dict[str, Entry]
    """Every path of the flattened root filesystem (upper layers win), without a leading /."""

    def resolve(self, path: str) -> str:
        """``path`` with its symbolic links followed, as the container sees it."""
        resolved, seen = "", 0
        for part in PurePosixPath(path.lstrip("/")).parts:
            resolved = posixpath.join(resolved, part)
            entry = self.files.get(resolved)
            while entry is not None and entry.type == tarfile.SYMTYPE:
                seen += 1
                assert seen < 40, f"symlink loop at {path}"
                target = entry.linkname
                base = "" if target.startswith("/") else posixpath.dirname(resolved)
                resolved = posixpath.normpath(posixpath.join(base, target)).lstrip("/")
                entry = self.files.get(resolved)
        return resolved


def _read(name: str) -> bool:
    """The files whose bytes the tests compare (the rest is skipped unread)."""
    return name.startswith("opt/kvserve/kernels/") or name.endswith(
        ("model/model.safetensors", f"/{smollm2.FILE}")
    )


@pytest.fixture(scope="module")
def image() -> Image:
    with tarfile.open(build_image()) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(manifest["Config"]))
        files: dict[str, Entry] = {}
        for layer_name in manifest["Layers"]:
            with tarfile.open(fileobj=archive.extractfile(layer_name)) as layer:
                for m in layer:
                    name = posixpath.normpath(m.name).lstrip("./")
                    head, base = posixpath.split(name)
                    if base.startswith(".wh."):
                        files.pop(posixpath.join(head, base[4:]), None)
                        continue
                    data = layer.extractfile(m).read() if m.isfile() and _read(name) else None
                    files[name] = Entry(m.type, m.size, m.linkname, data)
    return Image(manifest["RepoTags"], config["config"], files)


def test_tagged_for_the_charts(image):
    assert image.repo_tags == ["localhost/kvserve:dev"]


def test_runs_as_numeric_non_root_user_with_home_on_tmp(image):
    assert image.config["User"] == "1000"
    env = dict(e.split("=", 1) for e in image.config["Env"])
    assert env["HOME"] == "/tmp"
    assert env["KVSERVE_KERNEL_DIR"] == KERNEL_DIR
    assert env["PATH"].split(":")[0] == "/opt/kvserve/venv/bin"
    assert image.config["WorkingDir"] == "/tmp"


def test_serves_the_demo_model_by_default(image):
    assert image.config.get("Entrypoint") is None
    assert image.config["Cmd"] == ["kvserve", "serve", "--model", DEMO]
    assert list(image.config["ExposedPorts"]) == ["8000/tcp"]


def test_commands_of_the_pods_are_on_the_path(image):
    """The serving container runs `kvserve`, the operator and the init container `python`,
    the preStop hook `sleep`."""
    for command in ("kvserve", "python"):
        assert (
            image.files[image.resolve(f"/opt/kvserve/venv/bin/{command}")].type == tarfile.REGTYPE
        )
    assert image.files[image.resolve("/usr/bin/sleep")].type == tarfile.REGTYPE


def test_demo_model_is_the_servers_default_model(image):
    weights = image.files[image.resolve(f"{DEMO}/model.safetensors")]
    expected = (DEFAULT_MODEL / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights.data).hexdigest() == hashlib.sha256(expected).hexdigest()
    for name in sorted(p.name for p in Path(DEFAULT_MODEL).iterdir()):
        assert image.resolve(f"{DEMO}/{name}") in image.files, name


def test_smollm2_is_carried_and_is_the_default_without_a_model(image):
    gguf = image.files[image.resolve(f"{SMOLLM2}/{smollm2.FILE}")]
    assert hashlib.sha256(gguf.data).hexdigest() == smollm2.SHA256
    env = dict(e.split("=", 1) for e in image.config["Env"])
    assert str(smollm2.model_path(Path(env["KVSERVE_CACHE_DIR"]))) == f"{SMOLLM2}/{smollm2.FILE}"


def test_cpu_kernels_are_prebuilt_and_no_compiler_is_shipped(image, monkeypatch):
    monkeypatch.setenv("KVSERVE_KERNEL_DIR", KERNEL_DIR)
    expected = cpu_library.library_path().as_posix().lstrip("/")
    kernels = sorted(n for n in image.files if n.startswith("opt/kvserve/kernels/"))
    assert kernels == [expected]
    assert image.files[expected].data[:4] == b"\x7fELF"
    for compiler in ("usr/bin/cc", "usr/bin/gcc"):
        assert compiler not in image.files
