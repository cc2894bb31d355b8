# Entry points that work on a fresh Debian machine with Python 3.11 (root for the apt step):
#   make demo   run the daemon on a simulated 2xH200 node with a synthetic workload
#   make test   install everything, then ruff, mypy --strict (package and tests) and the whole test suite
#   make check  the fast suite: every test not marked integration, i.e. none that starts a process or binds a
#               socket (no mosquitto, Prometheus, flexmigd, job or CLI subprocess, no server of the daemon's own;
#               tests/conftest.py fails a test that does and is not marked); no lint, no Debian packages
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SPEC ?= h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6

.PHONY: demo test check lint venv debs

$(BIN)/flexmig: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,torch]'
	touch $@

venv: $(BIN)/flexmig

debs:
	@command -v mosquitto >/dev/null && command -v promtool >/dev/null && command -v systemd-analyze >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto prometheus systemd >/dev/null; }
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    slurmctld slurmd slurm-client munge >/dev/null; }

demo: venv
	$(BIN)/flexmigd --sim $(SPEC)

lint: venv
	$(BIN)/ruff check $(wildcard daemon tests bench examples dashboards)
	$(BIN)/mypy

test: venv debs lint
	$(BIN)/pytest -q

check: venv
	$(BIN)/pytest -q -m "not integration"
