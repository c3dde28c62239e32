# `make test` and `make demo` each create .venv when it is missing, so either works alone on a
# fresh clone. The stamp reinstalls when the dependency list or the torch pin changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RANKS ?= 3

.PHONY: venv test test-fast lint demo demo-toy demo-hs clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,hyperspectral,mpich]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# pytest exits 5 when it collects nothing: that is a broken suite here, never a pass.
# JOBS pytest workers (pytest-xdist), one per core by default: most of the suite is CPU
# (torch imports in launched ranks, in-process training), and worksteal keeps both cores busy
# to the end. JOBS=0 runs in this process, one test at a time (for pdb or -x).
JOBS ?= auto
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist worksteal)
# Bytecode for the repository's own modules, compiled once here (half a second): where the
# environment sets PYTHONDONTWRITEBYTECODE (this machine does), Python would otherwise compile
# lbtrain from source in every process the tests launch, 0.2 s of each rank's start.
# __pycache__ is git-ignored.
COMPILE = $(PY) -m compileall -q lbtrain hyperspectral tests
test: lint
	@$(COMPILE)
	@$(PY) -m pytest -q $(XDIST); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# The in-process tiers only (no mpiexec, no programs started): the edit-test loop.
test-fast: lint
	@$(COMPILE)
	@$(PY) -m pytest -q $(XDIST) -m "not slow"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# The main job: real Indian Pines (tensorly's offline copy) on 3 ranks that emulate devices 1x,
# 2x and 4x slow, balanced by the cost model; outputs in a new runs/<date-time>/, with a
# Perfetto trace of every rank's steps (trace.json) beside curves.png.
demo: $(STAMP)
	$(VENV)/bin/mpiexec -n 3 $(VENV)/bin/lbtrain train --dataset indian_pines --model hamida \
		--patch-size 11 --pca 30 --epochs 30 --global-batch 64 --threads 1 \
		--emulate-slowdown 1,2,4 --policy cost --trace trace.json

# The library call in a script of your own (examples/balanced_toy.py), checked against one process.
demo-toy: $(STAMP)
	$(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m mpi4py examples/balanced_toy.py

# The hyperspectral application alone, one process, on Indian Pines (tensorly's offline copy).
demo-hs: $(STAMP)
	$(PY) -m hyperspectral train --dataset indian_pines --model hamida --patch-size 11 --pca 30 \
		--epochs 30 --threads 2

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
