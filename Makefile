# Set-up and entry points. On a fresh clone `make test` builds .venv from requirements.txt, installs
# the project into it (editable, pyproject.toml) and runs the tests; .venv is rebuilt when
# requirements.txt changes or another PYTHON is asked for, the project reinstalled when pyproject.toml does.
#   make test                          build/refresh .venv, then run pytest, one worker per core
#   make test TEST_WORKERS=0           ... in one process (pytest-xdist's -n)
#   make test PYTHON=python3.12        build .venv from another interpreter
#   make test PYTEST_ARGS='-k masks'   pass options to pytest
#   make test-fast                     the suite without the tests marked slow
#   make test-kernels                  the suite under other CPU kernel sets (AVX2, generic, one thread)
#   make lint                          ruff check and ruff format --check (CI runs it before the tests)
#   make format                        ruff format and the safe ruff fixes, in place
#   make train                         build/refresh .venv, then train the default experiment
#   make train ARGS='model=rnn data.root=DIR'   ... with Hydra overrides
#   make bench-attention               the attention benchmark (scripts/bench_attention.py)
#   make bench-translate CHECKPOINTS='rnn=PATH transformer=PATH' DATA=DIR   translate.py speed
#   make bench-train DATA=DIR [CHECKPOINTS=...]   training throughput and memory (+ decoding speed)
#   make compare RUNS=multirun/compare_multi30k/DATE    the comparison report (scripts/compare.py)

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=
TEST_WORKERS ?= auto
# pytest-xdist: one worker per core, each test module on one worker (its module fixtures made once)
XDIST = -n $(TEST_WORKERS) --dist loadfile
ARGS ?=
# Whether PYTHON was chosen by the user (then a venv of another interpreter is rebuilt).
PYTHON_EXPLICIT := $(if $(filter command line environment,$(origin PYTHON)),1,0)
VPY := $(VENV)/bin/python

.PHONY: venv train test test-fast test-kernels lint format bench-attention bench-translate bench-train compare clean-venv

venv:
	@PYTHON="$(PYTHON)" VENV="$(VENV)" PYTHON_EXPLICIT=$(PYTHON_EXPLICIT) bash scripts/make_venv.sh

train: venv
	$(VPY) train.py $(ARGS)

test: venv
	$(VPY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: venv
	$(VPY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

test-kernels: venv
	VPY=$(VPY) bash scripts/test_kernels.sh $(PYTEST_ARGS)

lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

format: venv
	$(VPY) -m ruff check --fix .
	$(VPY) -m ruff format .

bench-attention: venv
	$(VPY) scripts/bench_attention.py

CHECKPOINTS ?=
DATA ?= $(MULTI30K_DIR)
bench-translate: venv
	$(VPY) scripts/benchmark.py translate $(addprefix --checkpoint ,$(CHECKPOINTS)) --data "$(DATA)"

bench-train: venv
	$(VPY) scripts/benchmark.py train $(addprefix --checkpoint ,$(CHECKPOINTS)) --data "$(DATA)"

RUNS ?=
compare: venv
	$(VPY) scripts/compare.py $(RUNS)

clean-venv:
	rm -rf $(VENV)
