# Ister: the two commands that matter are `make run` and `make test`; both install what they need.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
# Python writes its compiled modules (__pycache__) here even where the environment says not to: the suite
# starts hundreds of Python processes (brokers, CLIs, xdist workers) and, without .pyc files, each compiled
# every module it imported again (`ister --help`: 1.0 s of CPU without them, 0.5 s with; issue 40 item 6).
unexport PYTHONDONTWRITEBYTECODE
PY ?= python3
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install etcd postgresql iptables java chromium promtool image run test lint typecheck unit integration sim bench chaos proto clean

$(UV):
	$(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==0.13.9

$(BIN)/ister: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --all-groups --all-extras
	@touch $(BIN)/ister

install: $(BIN)/ister

# The etcd metadata backend's tests run a real etcd server (Debian package etcd-server).
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y etcd-server; \
	}

# The shared Iceberg catalog's tests (tests/integration/test_tables_postgres.py) run a throwaway PostgreSQL
# server (Debian package postgresql; its initdb and postgres live in /usr/lib/postgresql/VERSION/bin).
postgresql:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y postgresql; \
	}

# The network partition tests (tests/integration/test_partitions.py) put brokers in network namespaces and
# cut their paths with iptables (Debian package iptables; `ip` is iproute2's).
iptables:
	@{ command -v iptables || test -x /usr/sbin/iptables; } >/dev/null 2>&1 && \
	{ command -v ip || test -x /usr/sbin/ip || test -x /sbin/ip; } >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y iptables iproute2; \
	}

# The Spark connector's tests run a real local Spark, which needs a Java runtime (17 here).
# The console's browser tests (tests/console) drive the system's headless Chromium (Debian package
# chromium) through Playwright; Playwright's own browser download is never used.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y chromium; \
	}

java:
	@command -v java >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y openjdk-17-jre-headless; \
	}

# The alert rules are checked by promtool (Debian package prometheus; only its promtool is used).
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends prometheus; \
	}

# The broker's container image (deploy/Containerfile; docs/deploy.md): podman, and mmdebstrap for a base
# made from Debian packages when no registry answers. Not part of `make test`.
image:
	deploy/build-image.sh

run: install
	$(BIN)/ister broker

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/ruff format --check src tests bench

typecheck: install
	$(BIN)/mypy

unit: install etcd promtool
	$(BIN)/pytest -q tests/unit tests/sim

integration: install
	$(BIN)/pytest -q tests/integration

# The suite runs on pytest-xdist workers: its tests mostly wait on broker processes, so more workers than
# cores pay (README: the measured times). --dist loadgroup keeps each xdist_group (the Spark tests: one JVM)
# in one worker. TEST_WORKERS=0 runs it in this process, serially. Four: with .pyc files the run waits more
# than it computes (107 integration tests at load 8-15: 314 s on three workers, 286 s on four, all passed).
TEST_WORKERS ?= 4
test: lint typecheck etcd postgresql iptables java chromium promtool
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup tests

bench: install
	$(BIN)/ister bench

# A seeded chaos run on a real 3-broker cluster, its history checked (bench/chaos.py; docs/benchmarks.md).
MINUTES ?= 5
SEED ?= 1
chaos: install etcd iptables
	$(BIN)/python bench/chaos.py --minutes $(MINUTES) --seed $(SEED) --out chaos-$(SEED).json

proto: install
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache
