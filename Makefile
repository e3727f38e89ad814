# The two commands a new user runs: `make demo` and `make test`. Both set up the venv first.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)
export PYTHONPATH := $(CURDIR)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-all lint clean

$(STAMP): requirements.txt
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Python 3.11 is required")'
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

demo: setup
	$(PYTHON) -m bundle.demo run

test: setup
	$(PYTHON) -m pytest -m "not slow and not gpu"

test-all: setup
	$(PYTHON) -m pytest

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy bundle criteo models export server clients

clean:
	rm -rf artifacts reports logs model_repository data
