# make demo   the charm on a bundled sample GPU host, without Juju
# make test   the unit tests (what CI runs)
# make lint   ruff and mypy; make bench   hook costs next to a bare ops charm (ARGS=--quick, ARGS=--profile)
# make mutation   mutmut over src/ (hours; MODULE=src/vgpu/releases.py for one module, SAMPLE=8 for one in eight, JOBS=1 to spare the CPUs)
# make pack-check   replay charmcraft's dependency install without Rust or a C compiler
# make charm   a deployable .charm per platform of charmcraft.yaml, without LXD or snapd (OUT=dir, ARGS="--platform ubuntu@24.04:amd64")
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python

.PHONY: demo test bench lint mutation requirements pack-check charm clean

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
	$(PY) -m mypy

# Mutation testing (mutmut, configured in pyproject.toml): the unit tests against
# each mutant of src/, or of MODULE only. Results stay in mutants/; afterwards
# `MODULE=... .venv/bin/python tools/mutation.py show <mutant>` shows one.
$(VENV)/.mutation: $(VENV)/.ready
	$(PY) -m pip install --quiet '.[unit,mutation]'
	touch $@

mutation: $(VENV)/.mutation
	MODULE='$(MODULE)' SAMPLE='$(SAMPLE)' $(PY) tools/mutation.py run $(if $(JOBS),--max-children $(JOBS))
	MODULE='$(MODULE)' $(PY) tools/mutation.py results | grep -v 'not checked' || true
	MODULE='$(MODULE)' $(PY) tools/mutation.py summary

bench: $(VENV)/.ready
	$(PY) tools/bench.py $(ARGS)

# Pin the run-time dependencies (pyproject.toml) for charmcraft; needs uv.
# Written beside requirements.txt and moved over it only when uv succeeded.
requirements:
	@command -v uv >/dev/null 2>&1 || { echo "make requirements needs uv (pip install uv); requirements.txt left as it is" >&2; exit 1; }
	{ echo "# The charm's run-time dependencies with theirs, pinned for charmcraft's charm plugin."; \
	  echo "# Generated from pyproject.toml by: make requirements"; \
	  uv pip compile pyproject.toml --universal --python-version 3.10 --no-header --no-annotate; \
	} > requirements.txt.new || { rm -f requirements.txt.new; exit 1; }
	mv requirements.txt.new requirements.txt

# What charmcraft pack installs, replayed without Rust or a C compiler, then the
# charm imported from it; --control shows rpds-py failing to build from source there.
pack-check: $(VENV)/.ready
	$(PY) tools/check_pack.py --control $(ARGS)

# A .charm per platform (nova-compute-nvidia-vgpu_ubuntu@24.04-amd64.charm ...) from what git
# stores, with the wheels of each base's Python and machine, checked by charmcraft's linters.
# See docs/how-to/build-the-charm.md.
charm: $(VENV)/.ready
	$(PY) tools/build_charm.py --out '$(or $(OUT),.)' $(ARGS)

clean:
	rm -rf $(VENV) mutants build *.charm parts stage prime requirements.txt.new
