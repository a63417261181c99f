# Two commands, always true on a fresh machine with Python, a C compiler and
# the package registry: `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
VAR    := var
CONFIG := $(VAR)/notary.toml

.PHONY: run test test-compiled test-pure lint setup var bench bench-quick clean distclean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py notary/_fastcache.pyx notary/protocol/_fastrequest.pyx
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# First use creates ./var (key, certificate, database, bundle, config); later
# runs reuse it.
var: $(STAMP)
	$(PY) -m notary dev-init --dir $(VAR)

run: var
	$(PY) -m notary serve --config $(CONFIG)

# The whole suite twice: once requiring the compiled extensions (so a
# silently failed build cannot pass), once forcing the pure-Python twins.
# The two passes run at once, one per core (each alone takes ~6.5 minutes
# on a 2-core machine, one after the other ~13); each pass's output is shown
# as it ends, and make fails if either does.
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-compiled test-pure

test-compiled: $(STAMP)
	NOTARY_REQUIRE_EXTENSION=1 $(PY) -m pytest -q

test-pure: $(STAMP)
	NOTARY_NO_EXTENSIONS=1 $(PY) -m pytest -q

# The operator's load benchmark (bench/run.py): installs its tools (wrk,
# nginx, h2load, socat, openssl) first. Loopback only; about half an hour.
bench: $(STAMP)
	.ci/install-tools bench
	$(PY) bench/run.py

bench-quick: $(STAMP)
	.ci/install-tools bench
	$(PY) bench/run.py --quick

# ruff over everything; mypy over notary/ ([tool.mypy] in pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check notary tests bench
	$(PY) -m mypy

clean:
	rm -rf build *.egg-info notary/*.so notary/*/*.so notary/_fastcache.c notary/protocol/_fastrequest.c .pytest_cache

distclean: clean
	rm -rf $(VENV) $(VAR)
