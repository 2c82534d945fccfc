# make demo   the charm on a bundled sample GPU host, without Juju
# make test   the unit tests (what CI runs)
# make lint   ruff; make bench   hook costs next to a bare ops charm (ARGS=--quick, ARGS=--profile)
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python

.PHONY: demo test bench lint requirements clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet '.[unit]'
	touch $@

demo: $(VENV)/.ready
	$(PY) tools/demo.py $(ARGS)

test: $(VENV)/.ready
	$(PY) -m pytest unit_tests $(ARGS)

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src unit_tests tools tests

bench: $(VENV)/.ready
	$(PY) tools/bench.py $(ARGS)

# Pin the run-time dependencies (pyproject.toml) for charmcraft; needs uv.
requirements:
	{ echo "# The charm's run-time dependencies with theirs, pinned for charmcraft's python plugin."; \
	  echo "# Generated from pyproject.toml by: make requirements"; \
	  uv pip compile pyproject.toml --universal --python-version 3.10 --no-header --no-annotate; \
	} > requirements.txt

clean:
	rm -rf $(VENV) build *.charm
