# hetsched: the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
EXAMPLES := examples
STAMP := .deps.stamp

.PHONY: deps demo test test-fast lint bench clean gpu-check

# Installs what hetsched needs: Python packages (torch pinned to the CPU build
# on these machines) and, when root on Debian, Slurm and munge for the testbed and
# bindfs (a FUSE mount: the state file's journal on a file system other hosts share).
$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    ! { command -v slurmctld && command -v munged && command -v bindfs && \
	       [ -f /usr/include/slurm/spank.h ]; } >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			slurmctld slurmd slurm-client munge libslurm-dev gcc bindfs >/dev/null; fi
	$(PIP) install -q 'torch==2.13.0' || $(PIP) install -q torch
	$(PIP) install -q -e '.[plot,test,lint]'
	@touch $(STAMP)

deps: $(STAMP)

# The bundled example planned; then, where no Slurm site answers, the testbed example
# end to end on a local Slurm test cluster that goes down again (examples/demo-testbed.sh).
demo: $(STAMP)
	hetsched plan $(EXAMPLES)/jobs.yaml --cluster $(EXAMPLES)/cluster.yaml \
		--throughputs $(EXAMPLES)/gavel_throughputs.csv --gantt plan-gantt.png --out plan.json
	bash $(EXAMPLES)/demo-testbed.sh

test: $(STAMP)
	$(PYTHON) -m pytest -q

# The fast lane: no Slurm testbed, no multi-process torch, no subprocess-heavy suites
# (about six and a half minutes on 2 cores). `make test` still runs everything and is CI's command.
test-fast: $(STAMP)
	$(PYTHON) -m pytest -q -m "not slurm and not slow"

lint: $(STAMP)
	ruff check hetsched tests bench
	mypy hetsched
	lint-imports

bench: $(STAMP)
	$(PYTHON) bench/bench_planner.py

# The runtime's GPU figures in one table (probe vs run, switch overhead, zeroing, a pool
# plan predicted vs measured, a co-location group); on CPU: make gpu-check DEVICE=cpu
DEVICE ?=
gpu-check:  # no deps step: a GPU machine keeps its own CUDA build of torch
	$(PYTHON) bench/gpu_check.py $(if $(DEVICE),--device $(DEVICE),)

clean:
	rm -rf $(STAMP) .pytest_cache .hypothesis build *.egg-info plan.json plan-gantt.png
