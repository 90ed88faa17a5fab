# The two commands of the README, plus helpers. Each installs what it needs first (scripts/setup.sh).
.PHONY: setup demo test test-main lint bench

VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

setup:
	@bash scripts/setup.sh

## Train the CPU demo on the local sandbox (no GPU, no download); writes training_results/.
demo: setup
	$(BIN)/trl-sandbox train --preset cpu-demo --overwrite_output_dir true

## The whole test suite (offline) and the linter, then the suite on the other Pythons the project
## claims (scripts/test-matrix.sh: 3.10 to 3.13, each in its own .venv-pyX.Y).
## The other Pythons' environments are built beside the main suite (their log:
## .test-matrix-prepare.log); a failed build is retried, and reported, by the matrix run.
## It installs every optional language of the I/O judge first (scripts/setup.sh's IO_LANGUAGES:
## Java, Rust, Go, JavaScript; once, from the system's packages), so that the tests judge programs
## in each; `make test IO_LANGUAGES=` leaves out those not installed (the tests report them missing).
test test-main: export IO_LANGUAGES ?= java,rust,go,javascript
test: setup
	@bash scripts/test-matrix.sh --prepare > .test-matrix-prepare.log 2>&1 & prepare=$$!; \
	  $(MAKE) --no-print-directory test-main; rc=$$?; \
	  wait $$prepare; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	  bash scripts/test-matrix.sh

## The main suite alone, on .venv's Python. Test files run in TEST_WORKERS processes at once
## (pytest-xdist; a file stays in one process): most tests wait on sandboxes, servers and
## subprocesses, so three workers finish in about 60% of the time of one, also on 2 cores.
TEST_WORKERS ?= 3
export TEST_WORKERS
## The ray provider's tests run after the others, on their own: their Ray cluster and the dozens of
## sandbox actors its fault matrix starts would load the cores under the timing-sensitive tests.
test-main: setup
	$(BIN)/ruff check trl_sandbox plugins tests benchmarks examples scripts
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --ignore=plugins/ray
	$(BIN)/python -m pytest -q -p no:cacheprovider plugins/ray

lint: setup
	$(BIN)/ruff check trl_sandbox plugins tests benchmarks examples

bench: setup
	$(BIN)/python benchmarks/bench_local.py
	$(BIN)/python benchmarks/bench_hacks.py
	$(BIN)/python benchmarks/bench_cpu_demo.py
