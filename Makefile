# webhooker: `make run` serves, `make test` runs the whole suite. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test lint bench clean

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

run: $(INSTALLED)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py ensureadmin
	$(PY) manage.py serve

# Tests keep their data (SQLite file, secret key, sockets) apart from `make run`'s.
test: $(INSTALLED)
	DATA_DIR=$${TEST_DATA_DIR:-$(CURDIR)/.pytest-data} $(PY) -m pytest $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Benchmarks need wrk and nginx from Debian's packages, PostgreSQL and Redis running.
bench: $(INSTALLED)
	@command -v wrk >/dev/null && command -v nginx >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest-data
