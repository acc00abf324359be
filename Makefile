# torchring: `make demo` trains the example on 2 local ranks; `make test` runs every test.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
# cpu (default), cuda (the CUDA build from the Python index, several GB) or pip (what pip resolves)
TORCH_BUILD ?= cpu
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_STAMP := $(VENV)/.installed-torch-$(TORCH_VERSION)-$(TORCH_BUILD)
DEMO_STAMP := $(VENV)/.installed-demo-$(TORCH_VERSION)-$(TORCH_BUILD)
STAMP := $(VENV)/.installed-test-$(TORCH_VERSION)-$(TORCH_BUILD)
PYTEST_ARGS ?=

.PHONY: venv demo test test-deps image gpu-check lint clean

# torch first, of the build asked for (tools/install-torch.sh says which and from where), then torchring
# with what `make demo` needs (the examples extra) or what the tests need too (the test extra).
$(TORCH_STAMP): tools/install-torch.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@tools/install-torch.sh $(BIN)/python $(TORCH_VERSION) $(TORCH_BUILD)
	@touch $@

$(DEMO_STAMP): $(TORCH_STAMP) pyproject.toml
	@echo "installing torchring (editable) with the examples extra"
	@$(BIN)/python -m pip install --quiet -e '.[examples]'
	@touch $@

$(STAMP): $(TORCH_STAMP) pyproject.toml
	@echo "installing torchring (editable) with the test and examples extras"
	@$(BIN)/python -m pip install --quiet -e '.[test,examples]'
	@touch $@

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/torchring run -np 2 $(BIN)/python examples/mnist.py

# Three groups of tests run side by side (see tests/run_groups.py); PYTEST_ARGS reach every group, and
# PYTEST_ARGS that name test paths run just those.
test: lint test-deps
	$(BIN)/python tests/run_groups.py $(PYTEST_ARGS)

# Debian packages the tests run for real, installed as root where they are missing (elsewhere those tests
# skip and say why): openssh-server (the multi-host tests run a cluster of network namespaces with one
# sshd each), openmpi-bin (a real mpirun starts ranks in tests/integration/test_mpirun.py) and Slurm with munge
# (tests/multihost/test_slurm.py runs slurmctld and one slurmd per namespace host).
test-deps:
	@missing=""; [ -x /usr/sbin/sshd ] || missing=" openssh-server"; \
	command -v mpirun >/dev/null || missing="$$missing openmpi-bin"; \
	[ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/slurmctld ] && command -v srun >/dev/null && [ -x /usr/sbin/munged ] \
		|| missing="$$missing slurmd slurmctld slurm-client munge"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing for the tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
		|| (apt-get update -qq >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
		|| echo "could not install $$missing: the tests that need it will skip"; \
	fi

# The CPU image torchring:cpu (docker/Dockerfile.cpu), with or without registry access: docker/make_image.sh
# and docker/README.md. Settings: IMAGE, BASE_IMAGE, TORCH_VERSION, WHEELHOUSE (auto, 1, 0).
image:
	IMAGE=$(or $(IMAGE),torchring:cpu) TORCH_VERSION=$(TORCH_VERSION) docker/make_image.sh

# On a machine with CUDA: the GPU tests, then benchmarks/gpu_check.py at 2 ranks (values and targets), with a
# python whose torch sees CUDA (GPU_PYTHON, .venv, or python3 through .venv-gpu); installs nothing from an
# index (tools/gpu-check.sh says how it picks and what it runs; docs/testing.md, "The GPU check").
gpu-check:
	tools/gpu-check.sh

# ruff is pinned in the test extra; `make test` lints first.
lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
