# Two commands, always true on a fresh machine with Python, a C compiler and
# the package registry: `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
VAR    := var
CONFIG := $(VAR)/notary.toml

.PHONY: run test test-compiled test-pure lint setup var bench bench-quick clean distclean \
        firefox-addon firefox-lint firefox-unit

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py notary/_fastcache.pyx notary/protocol/_fastrequest.pyx notary/server/_fasttls.pyx \
        $(wildcard notary/_vendor/llhttp/src/*.c)
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

# The Firefox add-on (clients/firefox/): `make firefox-addon` builds the
# .xpi to load in Firefox (README, "The Firefox add-on"). npm installs only
# web-ext, pinned in package-lock.json, for `make firefox-lint`; the
# add-on itself has no npm dependency. Without npm the stamp is not made
# and the lint test says so (a failure under CI).
FIREFOX := clients/firefox
XPI     := build/notary-check.xpi
WEBEXT  := $(FIREFOX)/node_modules/.installed-stamp

firefox-addon: $(XPI)

$(XPI): $(FIREFOX)/manifest.json $(shell find $(FIREFOX)/src -type f 2>/dev/null)
	$(PYTHON) $(FIREFOX)/tools/build_xpi.py $@

$(WEBEXT): $(FIREFOX)/package.json $(FIREFOX)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  cd $(FIREFOX) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed-stamp; \
	else echo "npm is missing: web-ext lint of the Firefox add-on cannot run"; fi

firefox-lint: $(WEBEXT)
	cd $(FIREFOX) && npm run --silent lint

# The add-on's pure logic in Node's test runner (make test runs it too,
# from tests/test_firefox_addon_unit.py, against freshly signed fixtures).
firefox-unit:
	cd $(FIREFOX) && node --test test/*.test.mjs

# The whole suite twice: once requiring the compiled extensions (so a
# silently failed build cannot pass), once forcing the pure-Python twins.
# The two passes run at once, one per core (each alone takes ~6.5 minutes
# on a 2-core machine, one after the other ~13); each pass's output is shown
# as it ends, and make fails if either does.
# The add-on's tests (Node unit tests, web-ext lint, a real Firefox) run in
# the compiled pass only: they do not exercise the twins.
test: $(STAMP) $(WEBEXT)
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
	rm -rf build *.egg-info notary/*.so notary/*/*.so notary/_fastcache.c notary/protocol/_fastrequest.c notary/server/_fasttls.c .pytest_cache

distclean: clean
	rm -rf $(VENV) $(VAR)
