# Fresh-machine set-up: `make demo` and `make test` create a virtual environment inside the repo,
# install the CPU build of torch 2.13.0, triton and haloattn (editable), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
TRITON_VERSION ?= 3.6.0
PROFILE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml CMakeLists.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q triton==$(TRITON_VERSION) || echo "triton $(TRITON_VERSION) is not available here: the triton backend will say so"
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/haloattn profile $(PROFILE_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build
