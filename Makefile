# webhooker: `make run` serves, `make test` runs the whole suite. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# One stamp per set of extras: `make run` installs only what running needs, the
# test and benchmark tools come with `make test` and `make bench`.
INSTALLED := $(VENV)/.installed

.PHONY: run test lint bench bench-admin chaos clean lock

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(INSTALLED)-run: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

# The suite runs the benchmarks once, tiny (tests/e2e/test_bench.py): it needs their extras too.
$(INSTALLED)-test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

$(INSTALLED)-bench: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

run: $(INSTALLED)-run
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py ensureadmin
	$(PY) manage.py serve

# Tests keep their data (SQLite file, secret key, sockets) apart from `make run`'s.
# In parallel on TEST_WORKERS, then the serial tests alone (they time what a busy
# machine would starve). The default is one worker more than the cores: the suite's
# tests spend much of their time waiting on the processes they start (gunicorn,
# engines, receivers, a browser, PostgreSQL), and one worker per core left the
# cores idle meanwhile (bench/RESULTS.md). Serial tests live in tests/e2e
# (tests/conftest.py refuses one elsewhere): collecting only that folder spares the
# second run collecting the whole suite. Exit code 5 is "nothing selected".
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(INSTALLED)-test
	DATA_DIR=$${TEST_DATA_DIR:-$(CURDIR)/.pytest-data} $(PY) -m pytest -n $(TEST_WORKERS) \
		--dist worksteal -m "not serial" $(PYTEST_ARGS)
	DATA_DIR=$${TEST_DATA_DIR:-$(CURDIR)/.pytest-data} $(PY) -m pytest -m serial \
		$(or $(PYTEST_ARGS),tests/e2e) || [ $$? -eq 5 ]

lint: $(INSTALLED)-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Benchmarks need wrk and nginx from Debian's packages, PostgreSQL and Redis running.
bench: $(INSTALLED)-bench
	@command -v wrk >/dev/null && command -v nginx >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light)
	$(PY) bench/run.py

# The admin's pages on 500 000 events, 1 000 000 deliveries and 2 000 000 attempts
# (ADMIN_BENCH_SCALE=0.1 for a tenth; BENCH_DATABASES=sqlite for SQLite alone).
bench-admin: $(INSTALLED)-bench
	$(PY) bench/admin_scale.py

# The fault suite at length on PostgreSQL (tests/support/faults/suite.py): about 1 000 faults
# into real gunicorn and engine processes in under an hour; writes docs/faults.md.
# `make test` runs a short one (30 faults). CHAOS_FAULTS, CHAOS_INTERVAL, CHAOS_SEED.
chaos: $(INSTALLED)-test
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	DATA_DIR=$(CURDIR)/.pytest-data-pg CHAOS_FAULTS=$${CHAOS_FAULTS:-1000} \
	CHAOS_INTERVAL=$${CHAOS_INTERVAL:-2.5} CHAOS_QUIET=15 CHAOS_TIMEOUT=5400 \
	CHAOS_REPORT=$(CURDIR)/docs/faults.md \
	$(PY) -m pytest -s -p no:cacheprovider tests/e2e/test_faults.py -k lose_nothing

clean:
	rm -rf $(VENV) .pytest-data

# The Docker image's dependencies, every file with its hashes, from pyproject.toml's
# pins (pip-tools' pip-compile, in a venv of its own). Run after changing a pin;
# tests/unit/test_deployment.py says when it is out of date.
lock:
	$(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install -q pip-tools==7.7.0
	.venv-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --all-build-deps --extra otel \
	  --output-file requirements.lock pyproject.toml
