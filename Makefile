# Two entry points on a fresh machine; each sets itself up first.
#   make serve   create the virtual environment, install kvserve, serve the default model
#   make test    create the virtual environment, install kvserve with its test tools, run the tests
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: setup serve test lint k8s
setup: $(VENV)/.installed

serve: setup
	$(VENV)/bin/kvserve serve

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The operator's tests: kubectl + helm, and a v1.20 control plane built from Debian's source
# package (about 10 minutes once, then cached in ~/.cache/kvserve-k8s). KVSERVE_SKIP_K8S=1
# skips the build and, explicitly, the tests that need it.
k8s: setup
	PYTHON=$(PY) scripts/kube-control-plane.sh tools
ifneq ($(KVSERVE_SKIP_K8S),1)
	PYTHON=$(PY) scripts/kube-control-plane.sh build
endif

test: lint k8s
	$(PY) -m pytest -q -p no:cacheprovider tests
