# dra-testbed: the verbs people expect. Every target installs what it needs first.
#   make e2e     bring a local control plane up, prove it allocates, tear it down (KEEP=1 keeps it)
#                CLUSTER=kind: the same on a kind cluster, the driver as a DaemonSet (needs Docker + kind)
#   make test    unit + integration tests against the real local control plane
#                (PYTEST_WORKERS=2 processes, a test file each at a time, each with its own cluster; 0: serial)
#   make unit    the unit tests alone, the same way (no cluster; about a minute)
#   make bench   benchmark figures (COLD=1 re-runs a cold build; FLEET_NODES/FLEET_PROFILE size the fleet run)
#   make bench-peers  KWOK and the testbed side by side on one control plane (PEER_NODES, PEER_RUNS, PEER_IDENTITIES; builds KWOK once)
#   make lint    ruff + mypy
#   make clean   remove the virtualenv and caches of this checkout (not the built binaries)

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?= --durations=15
PYTEST_WORKERS ?= 2
RUNS ?= 5
FLEET_NODES ?= 1000
FLEET_PROFILE ?= gpu8
PEER_NODES ?= 500
PEER_RUNS ?= 3
PEER_IDENTITIES ?= per-node

.PHONY: install binaries bytecode e2e test unit bench bench-peers lint format protos clean clean-binaries

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(INSTALLED) binaries bytecode

# Compiled here once: where PYTHONDONTWRITEBYTECODE is set (many container images and CI
# machines set it), every process that imports the testbed (each CLI command, each
# NodeHost) would compile its 150 modules again, about 0.35 s of CPU each time.
bytecode: $(INSTALLED)
	@$(PY) -m compileall -q testbed fake_devices > /dev/null

binaries: $(INSTALLED)
	$(VENV)/bin/testbed binaries

e2e: install
	$(PY) scripts/$(if $(filter kind,$(CLUSTER)),e2e_kind.py,e2e.py)

test: install
	@if command -v go >/dev/null; then cd scripts/kube-build && CGO_ENABLED=0 go test ./cmd/...; \
	else echo "no Go toolchain: skipping the Go tests of scripts/kube-build/cmd"; fi
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

unit: $(INSTALLED) bytecode
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests/unit $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/bench_controlplane.py --runs $(RUNS) $(if $(COLD),--cold,)
	$(PY) benchmarks/bench_dra.py
	$(PY) benchmarks/bench_kubelets.py
	$(PY) benchmarks/bench_fleet.py --nodes $(FLEET_NODES) --profile $(FLEET_PROFILE) --nodes-per-host 100
	$(PY) benchmarks/bench_fleet.py --nodes $(FLEET_NODES) --profile $(FLEET_PROFILE) --nodes-per-host 100 --identities shared
	$(PY) benchmarks/bench_identities.py
	$(PY) benchmarks/bench_fleet.py --nodes 100 --profile tiny --nodes-per-host 50
	$(PY) benchmarks/bench_fleet.py --nodes 100 --profile tiny --nodes-per-host 50 --external-driver
	$(PY) benchmarks/bench_hosts.py --nodes $(FLEET_NODES) --profile $(FLEET_PROFILE)

bench-peers: install
	$(PY) benchmarks/bench_peers.py --nodes $(PEER_NODES) --runs $(PEER_RUNS) --identities $(PEER_IDENTITIES)

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(INSTALLED)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

protos: $(INSTALLED)
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-binaries: $(INSTALLED)
	rm -rf "$$($(PY) -c 'from testbed import config; print(config.binaries_cache_dir())')"
