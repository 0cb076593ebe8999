# Fresh-machine set-up: `make demo` and `make test` create a virtual environment inside the repo,
# install torch 2.13.0, triton and haloattn (editable), then run. Where $(PYTHON) already has a
# torch (a GPU machine's CUDA build, say), the environment reuses it through system site-packages
# instead of downloading another: the demo then runs on that machine's GPU. SYSTEM_TORCH=no forces
# the download.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
TRITON_VERSION ?= 3.6.0
PROFILE_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core (the interpreted kernels are single-threaded
# Python, so a 2-core CI machine runs the suite in about half the time); TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= auto

.PHONY: demo test test-torch-versions install clean

SYSTEM_TORCH ?= $(shell $(PYTHON) -c "import torch" >/dev/null 2>&1 && echo yes || echo no)

$(VENV)/.installed: pyproject.toml CMakeLists.txt
ifeq ($(SYSTEM_TORCH),yes)
	$(PYTHON) -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch; print('using the installed torch', torch.__version__)"
	$(PY) -c "import triton" 2>/dev/null || $(PIP) install -q triton==$(TRITON_VERSION) || echo "triton is not available here: the triton backends will say so"
	# offline machines: fall back to the build tools already installed
	$(PIP) install -q -e '.[test]' || $(PIP) install -q --no-build-isolation -e '.[test]'
else
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q triton==$(TRITON_VERSION) || echo "triton $(TRITON_VERSION) is not available here: the triton backend will say so"
	$(PIP) install -q -e '.[test]'
endif
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/haloattn profile $(PROFILE_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Not part of `make test`: downloads several GB a version (tests/other_torch_versions.sh).
test-torch-versions:
	bash tests/other_torch_versions.sh $(TORCH_VERSIONS)

clean:
	rm -rf $(VENV) .venv-torch-* build
