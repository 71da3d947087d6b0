# statebook developer entry points.  `make run` runs the demo, `make test` the suite.

PYTHON ?= python3
VENV := .venv
PYTEST_ARGS ?=
RUN_SECONDS ?= 12
# The console while `make run` runs (0: any free port; the address is printed). `statebook web` serves it alone.
WEB_PORT ?= 0
# Usage: $(PY_OK) <python>  -- fails unless <python> is 3.11 or newer.
PY_OK = sh -c 'if "$$0" -c "import sys; sys.exit(sys.version_info < (3, 11))"; then exit 0; fi; \
	echo "statebook needs Python >= 3.11; $$0 is $$("$$0" -V 2>&1). Use make PYTHON=python3.11 (and remove $(VENV) if it is stale)." >&2; exit 1'

.PHONY: venv run test test-deep bench bench-durable bench-web growth docs

venv: $(VENV)/.stamp

# The editable install is a tree of links (setuptools' strict mode, under build/) that mypy and pyright follow:
# the default mode serves pyproject's package-dir mapping through an import hook they cannot see. The tree holds
# the files present at install time, so a new module needs a reinstall: $(FILES) lists them, and a changed list
# reinstalls like a changed pyproject.toml. (Outside make: pip install -e . --config-settings editable_mode=strict.)
EDITABLE := --config-settings editable_mode=strict -e
FILES := $(VENV)/.files

# Reinstall only when pyproject.toml or the list of package files changed since the last successful install.
# Says what it is doing first, and pip names each package as it installs it: the first install takes about a
# minute, and a minute of silence looks like a hang.
$(VENV)/.stamp: pyproject.toml $(FILES)
	@test -x $(VENV)/bin/python || { $(PY_OK) $(PYTHON) && \
		echo "installing statebook into $(VENV) (first run, about a minute; later runs skip this)" && \
		$(PYTHON) -m venv $(VENV); }
	@$(PY_OK) $(VENV)/bin/python
	@test ! -f $@ || echo "pyproject.toml or the package's files changed: reinstalling statebook into $(VENV)"
	@$(VENV)/bin/pip install --disable-pip-version-check $(EDITABLE) ".[test]"
	@echo "statebook installed into $(VENV)"
	@touch $@

# Rewritten only when a file was added, removed or renamed, so the stamp above stays older otherwise.
$(FILES): FORCE
	@mkdir -p $(VENV)
	@find lifecycle outbox scheduler adapters -name __pycache__ -prune -o -type f -print | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

.PHONY: FORCE
FORCE:

run: venv
	$(VENV)/bin/statebook run --config examples/statebook.toml --for $(RUN_SECONDS) --web-port $(WEB_PORT)

# The suite in two phases (tests/run_suite.py): the parallel one on TEST_WORKERS xdist workers, then the tests
# marked serial alone; it ends with the time per folder and the 30 slowest tests. PYTEST_ARGS narrows both;
# TEST_WORKERS=N sets the workers (default 3; 1 against STATEBOOK_TEST_PG_URL).
test: venv
	$(VENV)/bin/python tests/run_suite.py $(PYTEST_ARGS)

# Nightly or before a release: the `deep` Hypothesis profile (ten times the examples and steps of `ci`, longer
# soaks) over the same two phases. Not part of .ci/run. specs/testing.md says what it runs.
test-deep: venv
	HYPOTHESIS_PROFILE=deep $(VENV)/bin/python tests/run_suite.py $(PYTEST_ARGS)

# `make bench BASELINE=main` also measures git revision main (installed in a temporary virtualenv)
# in the same rounds (tests/bench/run.py --baseline); BENCH_ARGS passes more options, e.g. --only W1,W2,W3.
BASELINE ?=
BENCH_ARGS ?=
bench: venv
	@echo "installing the bench extra into $(VENV) (pip names each package)"
	$(VENV)/bin/pip install $(EDITABLE) ".[test,bench]" && \
	$(VENV)/bin/python tests/bench/run.py $(if $(BASELINE),--baseline $(BASELINE)) $(BENCH_ARGS)

# W1-W3 on a throwaway cluster with fsync, synchronous_commit and full_page_writes on, and the floor's SQLite at
# synchronous=FULL (tests/bench/run.py --durable; writes tests/bench/results-durable.json). BENCH_ARGS as above.
bench-durable: venv
	@echo "installing the bench extra into $(VENV) (pip names each package)"
	$(VENV)/bin/pip install $(EDITABLE) ".[test,bench]" && \
	$(VENV)/bin/python tests/bench/run.py --durable --only W1,W2,W3 $(BENCH_ARGS)

# The console's pages on 100,000 entities and 1,000,000 facts, SQLite and PostgreSQL (tests/bench/web.py, a few
# minutes, most of it seeding): the median server time of each page against 150 ms. WEB_BENCH_ARGS, e.g.
# --backends sqlite or --entities 50000.
WEB_BENCH_ARGS ?=
bench-web: venv
	$(VENV)/bin/python tests/bench/web.py $(WEB_BENCH_ARGS)

# How drain, verify and scheduler evaluation cost grow (10k-1M history rows, 10-10,000 schedules; several
# minutes): a table, specs/performance-growth.png and tests/bench/growth.json. GROWTH_ARGS, e.g. --quick.
GROWTH_ARGS ?=
growth: venv
	@echo "installing the bench extra into $(VENV) (pip names each package)"
	$(VENV)/bin/pip install $(EDITABLE) ".[test,bench]" && \
	$(VENV)/bin/python tests/bench/growth.py $(GROWTH_ARGS)

# The console's screenshots in docs/img/ (console-overview.png, console-entity.png, console-respond.png), taken
# by the browser tests on SQLite in Debian's chromium (apt-get install chromium chromium-driver; tests/browser).
.PHONY: screenshots
screenshots: venv
	STATEBOOK_SCREENSHOTS=1 STATEBOOK_REQUIRE_BROWSER=1 $(VENV)/bin/python -m pytest -q -p no:xdist tests/browser -k sqlite

# The documentation site (mkdocs.yml, docs/): installs the `docs` extra, builds site/ with --strict.
# (The extra is installed again only when pyproject.toml changed.)
docs: venv $(VENV)/.docs-stamp
	@echo "building the documentation site into site/ (mkdocs --strict)"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(VENV)/.docs-stamp: pyproject.toml
	@echo "installing the docs extra (mkdocs and its plugins) into $(VENV); pip names each package"
	$(VENV)/bin/pip install $(EDITABLE) ".[test,docs]"
	@touch $@
