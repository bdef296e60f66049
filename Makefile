# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: anything looser pulls gigabytes of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,ucx]'
	# NIXL never imports torch but declares a CUDA one: --no-deps keeps the CPU build.
	$(BIN)/pip install -q --no-deps nixl-cu12==1.5.1
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/tierserve demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info
