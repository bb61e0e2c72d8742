# Two commands do everything on a fresh machine (both idempotent):
#   make train   create .venv, install raydra and its dependencies, run the default experiment
#   make test    the same set-up, then the whole test suite
# Extra arguments reach train.py through ARGS:  make train ARGS="scale.num_workers=1 logger=csv"

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch: a plain `pip install torch` pulls a multi-GB CUDA build. On a GPU
# machine: make install TORCH="torch"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install train test lint browser benchmark clean

install: $(STAMP)

$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-*
	touch $@

# The HTML report test renders in Debian's headless Chromium, driven by selenium through chromedriver.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium or chromedriver is missing: sudo apt-get install chromium chromium-driver"; fi; }

train: install
	$(PY) train.py $(ARGS)

# The linter and formatter the tree must pass (configured in pyproject.toml); `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install browser lint
	$(PY) -m pytest $(ARGS)

benchmark: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
