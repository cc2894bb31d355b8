# Entry points that work on a fresh Debian machine with Python 3.11 (root for the apt step):
#   make demo   flexmigd in mode act on a simulated H200 with a stream of demo jobs: fragmentation found, jobs migrated
#               (its own venv, .venv-demo: the package and its runtime dependencies only; DEMO_ARGS="--until-move")
#   make test   install everything, then ruff, mypy --strict (package and tests) and the whole test suite: make ids
#               (every test but the fault-injection ones, with GPU-instance IDs handed out adversarially), the
#               fault-injection tests in a run of their own (make fault), make driver-ids, then make slurm-newer
#               (its chroot made in the background meanwhile, from the start). Every suite runs in
#               a fresh, empty home directory made for the run (.ci/fresh-home). Most tests wait on daemons, brokers
#               and Slurm, so they run on JOBS pytest-xdist workers (default 4, a module's tests on one worker;
#               JOBS=0 runs them in one process)
#   make check  the fast suite: every test not marked integration, i.e. none that starts a process or binds a
#               socket (no mosquitto, Prometheus, flexmigd, job or CLI subprocess, no server of the daemon's own;
#               tests/conftest.py fails a test that does and is not marked), the layer table among them
#               (tests/repo/test_layers.py) and the size rule (tests/repo/test_sizes.py: no module over 600 lines, no
#               function over 60), and ruff's function-size rules (pyproject.toml); no other lint, no Debian
#               packages
#   make ids    the whole suite but the fault-injection tests with GPU-instance IDs handed out adversarially
#               (FLEXMIG_SIM_IDS, see docs/simulator.md: any legal ID, reused after a destroy), so that no test and
#               no code may assume a mapping. The seed is printed; make ids SIM_IDS=adversarial:N replays a run
#   make driver-ids  every test not marked integration, and the NVML, simulator, telemetry and daemon rooms, with
#               the IDs a real driver hands out (the simulator's default), in one run (FLEXMIG_INTEGRATION_ONLY_IN
#               leaves the other rooms' integration tests out; NO_IDS_ROOMS, which read no NVML, are left to make
#               ids); make test runs it after make ids
#   make fault  the fault-injection suite alone (marker fault: SIGKILL at seeded random points, disk full at each
#               journal write, corrupt journal/outbox pages, a slowloris on the metrics port); make test runs it too.
#               The seed is printed; FLEXMIG_FAULT_SEED=N replays a run. Needs root (it mounts a small tmpfs)
#   make slurm-newer  every Slurm test again against Debian 13's Slurm 24.11 (23.02 and later print --json in
#               another form), in a chroot made with debootstrap the first time (NEWER_SLURM; about a minute). Root
#   make bench  every benchmark under bench/, each writing its section of docs/results.md with the machine and date
#               (bench/results.py; hours on a 2-core machine; SECTIONS=planner,scrape reruns some, keeping the rest)
#   make bench-quick  the same with each benchmark's quick run, into out/results-quick.md (a smoke run)
PY ?= python3
# Python writes its bytecode caches (__pycache__/, ignored by git) here even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, as on CI's machines): without them every flexmigd, CLI and job process the suite starts
# compiles the package again (0.7 s of CPU each), and every pytest worker rewrites every test module (21 s against 8 s
# to collect the suite): tests/cli and tests/mqtt took 119 s without, 92 s with.
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_VENV ?= .venv-demo
DEMO_BIN := $(DEMO_VENV)/bin
DEMO_ARGS ?=
FRESH_HOME := .ci/fresh-home

.PHONY: demo test check ids driver-ids fault slurm-newer lint venv debs bench bench-quick

$(BIN)/flexmig: pyproject.toml hook/pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e './hook[transformers,lightning,fsdp]' -e '.[test,torch]'
	touch $@

venv: $(BIN)/flexmig

debs:
	@command -v mosquitto >/dev/null && command -v promtool >/dev/null && command -v systemd-analyze >/dev/null \
	  && command -v ip >/dev/null && command -v setpriv >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto prometheus systemd iproute2 util-linux >/dev/null; }
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null \
	  && command -v debootstrap >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    slurmctld slurmd slurm-client munge debootstrap >/dev/null; }

$(DEMO_BIN)/flexmig: pyproject.toml hook/pyproject.toml setup.py
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_BIN)/pip install -q -e ./hook -e .
	touch $@

demo: $(DEMO_BIN)/flexmig
	$(DEMO_BIN)/flexmig demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check $(wildcard daemon hook tests bench examples dashboards setup.py)
	$(BIN)/mypy

# Any legal GPU-instance ID for any instance, reused after a destroy: no test, and no code, may assume a mapping.
# (Drawn once, when make starts: a plain ?= would draw again at each use, and the seed printed would not be the one run.)
ifeq ($(origin SIM_IDS),undefined)
SIM_IDS := adversarial:$(shell od -An -N2 -tu2 /dev/urandom | tr -d ' ')
endif
DRIVER_ROOMS := tests/sim tests/nvml tests/telemetry tests/daemon
# Rooms whose code reads nothing from NVML (the pure core, the replay, job specs, the job-side hook, the benchmarks'
# models): no GPU-instance ID reaches them, so make driver-ids leaves them to make ids (a third of its time).
NO_IDS_ROOMS := tests/plan tests/detect tests/mig tests/replay tests/jobspec tests/hook tests/bench
JOBS ?= 4
XDIST := -n $(JOBS) --dist loadscope --no-loadscope-reorder  # the long modules first: tests/conftest.py

test: debs
	$(PY) tests/support/slurm_newer.py build $(NEWER_SLURM)
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory ids SIM_IDS=$(SIM_IDS)
	$(FRESH_HOME) $(BIN)/pytest -q -p no:cacheprovider $(XDIST) -m fault
	$(MAKE) --no-print-directory driver-ids
	$(MAKE) --no-print-directory slurm-newer

ids: venv
	@echo "GPU-instance IDs for this run: FLEXMIG_SIM_IDS=$(SIM_IDS) (make ids SIM_IDS=$(SIM_IDS) replays it)"
	FLEXMIG_SIM_IDS=$(SIM_IDS) $(FRESH_HOME) $(BIN)/pytest -q -p no:cacheprovider $(XDIST) -m "not fault"

driver-ids: venv
	FLEXMIG_INTEGRATION_ONLY_IN="$(DRIVER_ROOMS)" $(FRESH_HOME) $(BIN)/pytest -q -p no:cacheprovider $(XDIST) \
	  $(addprefix --ignore=,$(NO_IDS_ROOMS)) -m "not (integration and fault)"

# Every Slurm test again, against Debian 13's Slurm 24.11 in a chroot (made with debootstrap the first time, in
# NEWER_SLURM; its daemons and commands reached through wrappers in NEWER_SLURM.bin): tests/support/slurm_newer.py.
NEWER_SLURM ?= /var/cache/flexmig/slurm-trixie
slurm-newer: venv debs
	$(BIN)/python tests/support/slurm_newer.py up $(NEWER_SLURM)
	FLEXMIG_SLURM_BIN=$(NEWER_SLURM).bin $(FRESH_HOME) $(BIN)/pytest -q -p no:cacheprovider $(XDIST) tests/slurm; \
	  rc=$$?; $(BIN)/python tests/support/slurm_newer.py down $(NEWER_SLURM); exit $$rc

check: venv
	$(BIN)/ruff check --select C901,PLR0912,PLR0915 daemon hook
	$(FRESH_HOME) $(BIN)/pytest -q $(XDIST) -m "not integration"

fault: venv debs
	$(FRESH_HOME) $(BIN)/pytest -q -p no:cacheprovider $(XDIST) -m fault

bench: venv
	$(BIN)/python bench/results.py $(if $(SECTIONS),--only $(SECTIONS))

bench-quick: venv
	$(BIN)/python bench/results.py --quick --out out/results-quick.md $(if $(SECTIONS),--only $(SECTIONS))
