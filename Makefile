# gpuheal developer entry points. `make test` and `make demo` work on a fresh machine:
# they install what they need (uv + .venv, Debian's Slurm/munge, the Go-built cluster binaries)
# and cache the slow parts under ~/.cache/gpuheal/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
UV_VERSION := 0.13.9
CACHE ?= $(HOME)/.cache/gpuheal
UV := $(CACHE)/uv-$(UV_VERSION)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# what the demo's fault does to the job: dies (a real lost GPU), hangs, or gentle
DEMO_FAULT ?= dies
export UV  # the packaging test builds the wheel with this exact uv

.PHONY: help venv bytecode lint types unit bins system-deps images realnode-deps integration e2e kind test demo bench clean
help:
	@echo "make test   - lint + types + unit + integration (builds/caches the sandbox binaries)"
	@echo "make demo   - sandbox up (GPU nodes + Slurm), show an XID remediation, tear down"
	@echo "              (DEMO_FAULT=dies|hangs|gentle: what the fault does to the job)"
	@echo "make bench  - benchmarks into bench/out/ (JSON + PNG)"
	@echo "make images - the operator and bridge images as tars in ~/.cache/gpuheal/images/ (buildah)"
	@echo "make e2e    - the README's helm install on the sandbox's real node, an XID through the pods"

$(UV):
	python3 -m venv $(CACHE)/uv-$(UV_VERSION)
	$(CACHE)/uv-$(UV_VERSION)/bin/pip install -q uv==$(UV_VERSION)

# --compile-bytecode: these machines (and the operator image) set PYTHONDONTWRITEBYTECODE, so
# without it every start compiles every module from source (CLI start 0.59 s -> 0.23 s, the
# operator's imports 124 -> 105 MiB RSS; README "Speed and memory").
$(VENV)/.synced: $(UV) pyproject.toml slurm-bridge/pyproject.toml devtools/pyproject.toml uv.lock Makefile
	$(UV) sync --frozen --quiet --compile-bytecode
	touch $@

venv: $(VENV)/.synced

# The same for our own sources, which the venv holds as editable installs (uv compiles only
# site-packages): each operator, bridge and CLI process the tests start compiles ~100 modules
# again otherwise (0.09 s of CPU a start, ~300 starts in `make integration`). compileall
# rewrites only what changed (0.1 s when nothing did); stale .pyc are never used (mtime check).
bytecode: venv
	$(VENV)/bin/python -m compileall -q -j 0 operator/gpuheal slurm-bridge/gpuheal_bridge devtools/gpuheal_dev bench >/dev/null

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

types: venv
	$(VENV)/bin/mypy

# The unit tests are CPU-bound and independent: one xdist worker per core (UNIT_XDIST=0: one
# process). 1629 tests: 90 s serial, 65 s on two workers (2 cores, load 3.5).
UNIT_XDIST ?= 2
unit: bytecode
	$(VENV)/bin/pytest -m "not integration and not kind" -n $(UNIT_XDIST) $(PYTEST_ARGS)

# Go-built kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, helm.
bins:
	hack/build-cluster-bins.sh >/dev/null

# The operator and bridge images, built with buildah on bases made of Debian packages (no Docker,
# no registry), as docker-archive tars in $(CACHE)/images/ (README, Images); installs buildah,
# mmdebstrap, podman and runc when missing. Cold ~6 min, warm seconds. Load one into a
# kubelet's containerd: ctr -n k8s.io images import $(CACHE)/images/gpuheal.tar
images:
	hack/build-images.sh >/dev/null

# Debian's Slurm + munge for the sandbox's real Slurm cluster (no-op when present).
system-deps:
	hack/install-system-deps.sh

# What `sandbox up --real-node` runs on: the kubelet (its own cached build, ~40 s with a warm Go
# cache) and Debian's containerd, runc, CNI plugins and busybox-static (no-ops when present).
realnode-deps:
	hack/install-system-deps.sh realnode
	hack/build-cluster-bins.sh kubelet >/dev/null

# The integration tests wait far more than they compute: XDIST pytest-xdist workers run them
# side by side, each with its own sandbox (README, Tests); XDIST=0 runs them one after another
# in one process. The modules of one xdist_group (the real-node ones; test_images.py, which
# loads the image tars once) run on one worker. The 15 slowest are listed at the end of each
# run. Every integration test lives in tests/integration: the workers collect only that folder.
# Four: on a quiet 2-core machine six workers gained nothing (integration 12 min 22 s on six,
# 12 min 27 s on four, the same tree, both green) and load it more (up to 9 against 5), and the
# suite is CPU-bound there; XDIST=6 passed three whole runs too (README, Tests).
XDIST ?= 4
integration: bytecode bins system-deps images realnode-deps
	$(VENV)/bin/pytest tests/integration -m "integration" -n $(XDIST) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# gpuheal as it ships: the README's install block on the sandbox's real node with both images,
# Slurm 26.05, the XID story through the pods, helm uninstall (tests/integration/test_e2e_chart.py;
# README, Install). One sandbox, serially; `make integration` (so `make test`) runs it too.
e2e: bytecode bins system-deps images realnode-deps
	$(VENV)/bin/pytest tests/integration/test_e2e_chart.py -m integration -p no:xdist --durations=15 $(PYTEST_ARGS)

# tests/e2e only: the kind tests live there, and collecting the whole tree to pick them took 12 s.
kind: venv
	$(VENV)/bin/pytest tests/e2e -m "kind" $(PYTEST_ARGS)

# The unit suite runs beside the integration suite, niced: the integration suite waits on its
# sandboxes much of the time (1.4 of 2 cores busy on average), and the unit tests fill those
# gaps instead of taking ~50 s of their own before it. Their summary prints when they end (the
# whole log in $(UNIT_LOG)); the target fails if either suite fails. kind first: its tests skip
# where Docker is missing, and the run should close on the real suite.
UNIT_LOG ?= .sandbox/unit-tests.log
test: lint types kind bytecode bins system-deps images realnode-deps
	@mkdir -p $(dir $(UNIT_LOG))
	@echo "unit tests: running beside the integration suite (nice 10; log $(UNIT_LOG))"
	@( rc=0; nice -n 10 $(MAKE) --no-print-directory unit > $(UNIT_LOG) 2>&1 || rc=$$?; \
	   summary=$$(grep -E '^=+ .* in [0-9.]+s' $(UNIT_LOG) | tail -n 1 | sed -E 's/^=+ | =+$$//g') || true; \
	   echo; echo "unit tests: $${summary:-no summary, see the log} (exit $$rc)"; \
	   grep -E '^(FAILED|ERROR) ' $(UNIT_LOG) || true; exit $$rc ) & pid=$$!; \
	integration=0; $(MAKE) --no-print-directory integration || integration=$$?; \
	unit=0; wait $$pid || unit=$$?; \
	echo "make test: unit tests exit $$unit, integration tests exit $$integration"; \
	[ $$unit -eq 0 ] && [ $$integration -eq 0 ]

demo: bytecode bins system-deps
	$(VENV)/bin/gpuheal-dev demo --fault $(DEMO_FAULT)

bench: bytecode bins system-deps
	$(PY) -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .sandbox
