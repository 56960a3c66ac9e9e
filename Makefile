# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# `make` installs the pinned, tested set in constraints.txt; pyproject.toml keeps the supported ranges.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specmm-installed

.PHONY: install demo demo-tiny test test-transformers lint bench lock clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

# Re-installs only when pyproject.toml or the pins changed since the last install.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install -c constraints.txt -e ".[test,bench,lint]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specmm demo

# The same demo on the tiny zoo: about two minutes, figures meaningless (it checks the pipeline, not speed).
demo-tiny: $(STAMP)
	$(VENV)/bin/specmm demo --scale tiny

test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

# The suite under every tested transformers version (tools/test_transformers.sh; ARGS= picks tests).
test-transformers: $(STAMP)
	tools/test_transformers.sh $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/specmm bench core

# Re-resolves the pinned set from pyproject.toml's ranges (then run make test and make test-transformers).
lock:
	PYTHON=$(PYTHON) tools/lock.sh

clean:
	rm -rf $(VENV) .venv-transformers-* build *.egg-info
