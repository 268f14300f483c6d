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

.PHONY: setup serve test lint
setup: $(VENV)/.installed

serve: setup
	$(VENV)/bin/kvserve serve

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -p no:cacheprovider tests
