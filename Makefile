# Two commands do everything on a fresh machine (both idempotent):
#   make train   create .venv, install raydra and its dependencies, run the default experiment
#   make test    the same set-up, then the whole test suite
# Extra arguments reach train.py through ARGS:  make train ARGS="scale.num_workers=1 logger=csv"

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch's CPU build, asked for by its local version (+cpu): on Linux a plain `torch==2.13.0` from PyPI
# is the CUDA build (several GB of nvidia-* wheels). pip takes +cpu from a wheel it already finds (a
# find-links folder, as on the project's machines, or its cache), else from PyTorch's CPU index;
# PyPI has no +cpu, so the first try fails in a second where none is on disk. macOS has no +cpu:
# PyPI's build there is the CPU one. On a GPU machine: make install TORCH="torch==2.13.0" (where pip's
# find-links hold the +cpu wheel, pip takes it for that too: a local version sorts above the plain one).
ifeq ($(shell uname -s),Darwin)
TORCH  ?= torch==2.13.0
else
TORCH  ?= torch==2.13.0+cpu
endif
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Last resort, where neither holds +cpu (PyTorch's index unreachable, as from a machine that reaches
# only PyPI): the plain build, which trains on CPU too, as every earlier install here did.
TORCH_ANY ?= torch==2.13.0
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install train test lint browser slurm benchmark clean

install: $(STAMP)

# pip compiles the ~29,000 installed .py files one at a time (~130 s of a fresh install here);
# compileall does it on every core after (~80 s on 2). A file in a newer Python's syntax (torch ships
# one) fails to compile there as it does under pip, and stays uncompiled: hence `|| true`.
$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile "$(TORCH)" 2>/dev/null \
	  || $(PY) -m pip install -q --no-compile --extra-index-url $(TORCH_INDEX) "$(TORCH)" 2>/dev/null \
	  || $(PY) -m pip install -q --no-compile "$(TORCH_ANY)"
	$(PY) -m pip install -q --no-compile -e ".[dev]"
	# W&B's own reader of its .wandb files, for the tests (tests/wandb_reader.py): wandb 0.31 ships
	# none, 0.29.0's DataStore reads the same files. Kept apart from the venv's wandb, without its dependencies.
	rm -rf $(VENV)/wandb-0.29-reader
	$(PY) -m pip install -q --no-compile --no-deps --target $(VENV)/wandb-0.29-reader "wandb==0.29.0"
	$(PY) -m compileall -q -j0 $(VENV)/lib >/dev/null || true
	rm -f $(VENV)/.installed-*
	touch $@

# The HTML report test renders in Debian's headless Chromium, driven by selenium through chromedriver.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium or chromedriver is missing: sudo apt-get install chromium chromium-driver"; fi; }

# The SLURM tests run a SLURM of their own on this machine (tests/system/test_slurm.py): Debian's daemons,
# client commands and munge, not started here (the tests start and stop theirs, on free ports).
slurm:
	@{ command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; \
	  else echo "SLURM is missing: sudo apt-get install slurmctld slurmd slurm-client munge"; fi; }

train: install
	$(PY) train.py $(ARGS)

# The linter, formatter and type checker the tree must pass (configured in pyproject.toml); `make test`
# runs them first. basedpyright is told the venv's Python, whose packages it checks raydra against.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/basedpyright --pythonpath $(PY)

test: install browser slurm lint
	$(PY) -m pytest $(ARGS)

benchmark: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
