# `make reproduce` runs the default workflow, `make test` the test suite.
# Each sets up .venv from envs/requirements.txt first when it is missing.
# A run stopped half-way (Snakemake itself killed) resumes: `hotcold resume` first ends the jobs the killed
# Snakemake left running, clears its lock (no Snakemake running here holds it) and its half-written files;
# then incomplete jobs rerun.
SHELL := /bin/bash
PYTHON ?= python3
# PYTHON as found before .venv/bin goes first on PATH (below): the interpreter whose pip installs the lock
HOST_PYTHON := $(or $(shell command -v $(PYTHON)),$(PYTHON))
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= 2
CONFIG ?=
SNAKEMAKE := $(BIN)/snakemake --cores $(CORES) --show-failed-logs --rerun-incomplete $(if $(CONFIG),--configfile $(CONFIG),)
export PATH := $(BIN):$(PATH)

.PHONY: setup lock reproduce figures report test test-all bench gpu-check lint clean

setup: $(STAMP)

# The optional peers (envs/peers.txt) stay only if they install beside the pinned packages and import.
# A module's bytecode is written where it is first imported, even where the environment sets
# PYTHONDONTWRITEBYTECODE (without bytecode each process of the workflow spent 1.4 s more importing torch): the
# set-up's probes write torch's and the peers', and an import of the libraries every test worker and job starts
# with (WARM_IMPORTS, beside the probes: 12 s cold, 5 s with bytecode) theirs, which the test workers and the
# workflow's first jobs each compiled at once; the first test or job writes the rest. pip compiles nothing (its
# compiling is serial: 68 s); compiling every installed module at set-up took 25 s.
unexport PYTHONDONTWRITEBYTECODE
WARM_IMPORTS := import pandas, pyarrow.parquet, scipy.stats, matplotlib.pyplot, seaborn, numba, jsonschema, yaml, \
	snakemake.api
# uv installs the lock (and the package and its peers) where it installs; pip otherwise (envs/install.py)
UV := uv==0.13.9
PIP := $(BIN)/python envs/install.py add --venv $(VENV) --
# Where the environment's torch sees a GPU, the FBGEMM peer is its CUDA build (envs/peers-cuda.txt), probed
# by a TBE forward on the GPU; elsewhere the CPU build (envs/peers.txt), probed by an import. TorchRec (it
# imports fbgemm_gpu) is kept only where FBGEMM is; it is not probed here (importing it the first time took
# 15 s, at the end of the set-up): `hotcold torchrec-peer` and its tests ask whether it imports when they run.
FBGEMM_PROBE := import sys; from hotcold.embedding.fbgemm import available; r = available(sys.argv[1]); r and print(r); sys.exit(r is not None)
# A set-up run again over a venv that has the peers: pip's check names what TorchRec's --no-deps pins leave out
# (fbgemm-gpu, the CUDA build's name, among them); only the other packages' conflicts fail it.
NODEPS_NAMES := $(shell sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' envs/peers-nodeps.txt | paste -sd'|' -)
# envs/requirements.lock pins every package (`make lock` writes it from envs/requirements.txt), pip among them:
# nothing is resolved. Where PYTHON has pip, its pip installs into a venv made without one (making the venv with
# its own pip took 7-8 s: ensurepip compiles pip); elsewhere the venv's own pip does. That pip installs uv, and
# uv the lock, with pip's indexes and links (envs/install.py: 15 s on 2 cores); where uv does not install, CORES
# pip processes do (31 s). Then, beside WARM_IMPORTS and the device probe (importing torch the first time: 6 s):
# pip's check, then TorchRec's pure-Python pins (--no-deps) beside the package itself; then FBGEMM and its probe.
$(STAMP): envs/requirements.lock envs/peers.txt envs/peers-cuda.txt envs/peers-nodeps.txt pyproject.toml
	if $(HOST_PYTHON) -m pip --version >/dev/null 2>&1; then \
		$(HOST_PYTHON) -m venv --without-pip $(VENV) && pip="$(HOST_PYTHON) -m pip --python $(BIN)/python"; \
	else $(HOST_PYTHON) -m venv $(VENV) && pip="$(BIN)/python -m pip"; fi && \
	$(BIN)/python envs/install.py lock envs/requirements.lock --jobs $(CORES) --uv $(UV) --venv $(VENV) -- $$pip
	@$(BIN)/python -c '$(WARM_IMPORTS)' & warm=$$!; \
	$(BIN)/python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' > $(VENV)/device.txt & probe=$$!; \
	if ! $(BIN)/python -m pip check > $(VENV)/pip-check.txt 2>&1; then \
		grep -v -i -E "^($(NODEPS_NAMES)) " $(VENV)/pip-check.txt && exit 1; fi; \
	$(PIP) --no-deps -r envs/peers-nodeps.txt & nodeps=$$!; \
	$(PIP) --no-deps --no-build-isolation -e . || exit 1; \
	wait $$probe; dev=$$(cat $(VENV)/device.txt); \
	peers=envs/peers.txt; [ "$$dev" = cuda ] && peers=envs/peers-cuda.txt; fbgemm=1; \
	if $(PIP) -r $$peers -c envs/requirements.lock; then $(BIN)/python -c '$(FBGEMM_PROBE)' $$dev; fbgemm=$$?; fi; \
	wait $$nodeps; torchrec=$$?; \
	if [ $$fbgemm = 0 ]; then echo "peers: fbgemm installed ($$peers, probed on $$dev); the fbgemm runs train"; \
	else $(BIN)/python -m pip uninstall --quiet --yes fbgemm-gpu-cpu fbgemm-gpu >/dev/null 2>&1 || true; \
		echo "peers: fbgemm not installed ($$peers did not install or run on $$dev here); the fbgemm runs are skipped"; fi; \
	if [ $$fbgemm = 0 ] && [ $$torchrec = 0 ]; then echo "peers: torchrec installed (envs/peers-nodeps.txt); torchrec-peer runs where it imports"; \
	else $(BIN)/python -m pip uninstall --quiet --yes torchrec >/dev/null 2>&1 || true; \
		echo "peers: torchrec not installed (envs/peers-nodeps.txt); torchrec-peer and its tests are skipped"; fi; \
	wait $$warm || exit 1
	touch $(STAMP)

# After a pin in envs/requirements.txt changes: resolve it once in a scratch environment and write the lock.
lock:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(PYTHON) -m venv "$$tmp" \
		&& "$$tmp/bin/python" -m pip install --quiet --no-compile -r envs/requirements.txt \
		&& "$$tmp/bin/python" envs/lock.py > envs/requirements.lock.part && mv envs/requirements.lock.part envs/requirements.lock
	@echo "wrote envs/requirements.lock"

RESUME := $(BIN)/python -m hotcold resume
# A config file of one's own is checked first (its YAML line, the setting and what is allowed, in one line):
# Snakemake reads it before the workflow and names neither the file nor the line.
CHECK_CONFIG := $(if $(CONFIG),$(BIN)/python -m hotcold check-config $(CONFIG),@true)

reproduce: $(STAMP)
	$(CHECK_CONFIG)
	$(RESUME)
	$(SNAKEMAKE)
	@echo
	@echo "Summary table: results/tables/summary.md (and summary.csv)"
	@echo "Speed-ups:     results/tables/speedup.md"
	@echo "Figures:       paper_figs/"
	@echo
	@cat results/tables/infeasible.md

# Redraws every table and figure from the runs, simulations, profiles and calibration there (only the rules that
# draw are allowed, each forced): a run's missing files stop it with one line naming them.
DRAWING_RULES := aggregate cache_sim dataset_stats scaleout_tables costmodel_validation claims figures scaleout_figures \
	hit_rate_curves
figures: $(STAMP)
	$(CHECK_CONFIG)
	$(RESUME)
	HOTCOLD_TABLES_ONLY=1 $(SNAKEMAKE) --allowed-rules $(DRAWING_RULES) all --forcerun $(DRAWING_RULES) -- all

# After `make reproduce` (with the same CONFIG): every table and figure, with its caption, in one HTML file.
report: $(STAMP)
	@test -f results/tables/summary.csv || { echo "No results to report: run make reproduce first." >&2; exit 1; }
	$(SNAKEMAKE) --report results/report.html
	@echo "Report: results/report.html"

# The default tier (pyproject.toml: not `slow`); test-all runs every test. Both spread the test files over
# CORES workers (pytest-xdist; one file stays on one worker, so its module fixtures are made once). The files go
# out in the order tests/conftest.py gives them, longest first: xdist's own order (most tests first) started the
# two-test workflow file last and left the other worker idle for its 100 s (warm suite 4:27 -> 3:17).
PYTEST := $(BIN)/python -m pytest -n $(CORES) --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(PYTEST)

test-all: $(STAMP)
	$(PYTEST) -m ""

bench: $(STAMP)
	$(BIN)/python -m pytest tests/benchmarks --benchmark-only

# On a GPU machine with torch but without Snakemake, internet or `make setup`: the machine's own python (PYTHON,
# default python3) runs the CUDA test cases and every one-process method, and writes one table
# (results/gpu_check/gpu_check.md; docs/gpu.md). Without a GPU: the same on the CPU at a tiny scale.
# GPU_CHECK_ARGS passes options, e.g. GPU_CHECK_ARGS="--no-tests --steps 50".
gpu-check:
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m hotcold gpu-check $(GPU_CHECK_ARGS)

lint: $(STAMP)
	$(BIN)/snakemake --lint

# Downloaded raw files (results/raw/) are kept: fetching them again takes hours.
clean:
	rm -rf results/data results/runs results/profiles results/sim results/shard_sim results/tables results/logs results/benchmarks \
		results/hardware results/report.html \
		paper_figs/*.png paper_figs/*.pdf .snakemake
