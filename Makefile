# make demo   the charm on a bundled sample GPU host, without Juju
# make test   the unit tests (what CI runs), in parallel (TEST_JOBS=0: in one process)
# make nova-functional   Nova's own functional harness judges what the charm publishes (NOVA_VERSION=31.0.0 for 2025.1)
# make lint   ruff and mypy; make bench   hook costs next to a bare ops charm (ARGS=--quick, ARGS=--profile)
# make mutation   mutmut over src/ (hours; MODULE=src/vgpu/releases.py for one module, SAMPLE=8 for one in eight, JOBS=1 to spare the CPUs)
# make pack-check   replay charmcraft's dependency install without Rust or a C compiler
# make prerequisites   checks the system tools make test needs, naming the one command that installs them
# make charm   a deployable .charm per platform of charmcraft.yaml, without LXD or snapd (OUT=dir, ARGS="--platform ubuntu@24.04:amd64")
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python

.PHONY: demo test bench lint mutation requirements pack-check charm clean nova-functional prerequisites

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet '.[unit]'
	touch $@

# What make test needs besides PyPI (.ci/run installs them; README.md, "Prerequisites"): dpkg-deb
# builds the test packages, prometheus and promtool check the alert rules and scrape the exporter
# (unit_tests/test_alert_rules.py, test_prometheus.py fail without them), python3's venv makes .venv.
APT_PREREQUISITES = sudo apt install --no-install-recommends dpkg python3-venv prometheus
prerequisites:
	@missing=""; \
	for tool in dpkg-deb prometheus promtool; do \
	    command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	$(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	    echo "make test needs:$$missing. Install them with:" >&2; \
	    echo "  $(APT_PREREQUISITES)" >&2; \
	    echo "  (with systemd, then: sudo systemctl disable --now prometheus; the tests start their own)" >&2; \
	    exit 1; \
	fi

demo: $(VENV)/.ready
	$(PY) tools/demo.py $(ARGS)

# The tests marked nova need Nova itself, which .venv has not: make nova-functional runs them.
# In parallel (pytest-xdist): one worker per CPU, TEST_JOBS=0 for one process; the charm is
# built once for all workers (unit_tests/packing.py, shared). ARGS go to pytest last (ARGS=-x,
# ARGS="-k dispatch", ARGS="-n 4").
TEST_JOBS ?= auto
test: prerequisites $(VENV)/.ready
	$(PY) -m pytest unit_tests -m 'not nova' -n $(TEST_JOBS) $(ARGS)

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check src unit_tests tools tests nova_functional
	$(PY) -m mypy

# Nova's functional harness (nova/tests, shipped in Nova's wheel) in its own venv, one per
# Nova version, pinned by nova_functional/constraints-<version>.txt; etc/nova/api-paste.ini,
# which only Nova's sdist carries, is taken from it. The tests are testtools test cases
# (Nova's base classes clear their attributes, which pytest cannot run): docs/reference/nova-functional.md.
NOVA_VERSION ?= 34.0.0
NOVA_VENV ?= .nova-venv-$(NOVA_VERSION)
NOVA_PY = $(NOVA_VENV)/bin/python
# What testtools runs: all of nova_functional/, or e.g. NOVA_TESTS=nova_functional.test_vfio
NOVA_TESTS ?= discover -s nova_functional -t .
# Then pytest runs the unit tests marked nova (pytest.mark.nova, see unit_tests/conftest.py)
# from the modules that mark some; NOVA_UNIT_TESTS= leaves them out.
NOVA_UNIT_TESTS ?= $(shell grep -l 'pytest\.mark\.nova' unit_tests/test_*.py)

$(NOVA_VENV)/.ready: nova_functional/requirements.txt nova_functional/constraints-$(NOVA_VERSION).txt
	rm -rf $(NOVA_VENV)
	$(PYTHON) -m venv $(NOVA_VENV)
	$(NOVA_PY) -m pip install --quiet --upgrade pip
	$(NOVA_PY) -m pip install --quiet -r nova_functional/requirements.txt \
	    -c nova_functional/constraints-$(NOVA_VERSION).txt 'nova==$(NOVA_VERSION)'
	$(NOVA_PY) -m pip download --quiet --no-deps --no-binary :all: 'nova==$(NOVA_VERSION)' -d $(NOVA_VENV)/sdist
	tar -xzf $(NOVA_VENV)/sdist/nova-$(NOVA_VERSION).tar.gz -C $(NOVA_VENV) --strip-components=1 \
	    nova-$(NOVA_VERSION)/etc/nova/api-paste.ini
	touch $@

# Both run, each printing its counts (.ci/run reads them); either failing fails the target.
nova-functional: $(NOVA_VENV)/.ready
	status=0; \
	NOVA_API_PASTE='$(CURDIR)/$(NOVA_VENV)/etc/nova/api-paste.ini' PYTHONPATH=src:. \
	    $(NOVA_PY) -m testtools.run $(NOVA_TESTS) || status=$$?; \
	$(if $(strip $(NOVA_UNIT_TESTS)),$(NOVA_PY) -m pytest -m nova $(NOVA_UNIT_TESTS) || status=$$?;) \
	exit $$status

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
	rm -rf $(VENV) .nova-venv-* mutants build *.charm parts stage prime requirements.txt.new
