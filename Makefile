# Set-up and entry points. `make test` on a fresh clone builds .venv from requirements.txt and
# runs the test suite; the venv is rebuilt whenever requirements.txt (or PYTHON) changes.
#   make test                     create/refresh .venv, then run pytest
#   make test PYTHON=python3.12   build the venv from another interpreter
#   make test PYTEST_ARGS='-k attention'

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=

VPY := $(VENV)/bin/python
# The stamp names the interpreter the venv was built from, so changing PYTHON rebuilds it.
STAMP := $(VENV)/.installed-$(subst /,_,$(PYTHON))
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)

.PHONY: venv test bench-attention clean-venv

venv: $(STAMP)

$(STAMP): requirements.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: resolving a bare `torch` would pull a multi-GB CUDA build.
	$(VPY) -m pip install --quiet "$(TORCH_PIN)"
	$(VPY) -m pip install --quiet -r requirements.txt
	touch $@

test: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS)

bench-attention: $(STAMP)
	$(VPY) scripts/bench_attention.py

clean-venv:
	rm -rf $(VENV)
