# Data Parallel from Scratch: two commands do all the set-up.
#   make book   build the static site (creates .venv from requirements-lock.txt if needed)
#   make test   the same set-up, then every test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements-lock.txt
VENDOR := vendor/.stamp
NB_SANITIZE := tests/nbval_sanitize.cfg
export PYTHONHASHSEED := 0

.PHONY: setup ready practice-manifest book test lint format test-unit test-notebooks test-portable test-budget test-book test-browser test-practice lab lab-copies bench notebooks lock clean help

help:
	@echo "make setup  - create the Python environment (.venv) alone: enough for the judge"
	@echo "make book   - build the static site into _build/html"
	@echo "make test   - every test: mylib, notebooks (nbval), practice, book build, browser"
	@echo "make test-portable - the notebooks again under other CPU kernels: same outputs"
	@echo "make lab    - open JupyterLab on copies of the notebooks (.lab/; FRESH=1: fresh copies)"
	@echo "make bench  - benchmarks: MyDDP vs PyTorch DDP, timeline model vs measurement (gloo, emulated link)"
	@echo "make notebooks - re-execute every notebook and save its outputs"
	@echo "make lint   - ruff check and ruff format --check (make format fixes the format)"
	@echo "make lock   - pin every package requirements.txt brings in ($(LOCK))"

# The virtual environment is installed from the lock (exact versions of
# everything requirements.txt brings in), again whenever either changes. pip
# installs one package after another on one core, and torch's wheel takes 40% of
# that (11 of 28 s here), so it installs beside the rest, each pip with --no-deps:
# the lock names every package, and `pip check` then confirms that they agree. Every
# module is byte-compiled once, here: where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines), nothing compiled later is kept, and every process would
# compile torch again at each import. pip compiles one file at a time (50 of the
# 80 s of the install on 2 cores); compileall -j 0 uses every core. Like pip, it
# leaves the few files written in a newer Python's syntax uncompiled (their errors
# are not shown). The test suites that packages ship (folders named tests/: 1,530
# of the 10,853 files, 12% of the bytes) are never imported, so not compiled.
# First, whether the Python is new enough for the lock (pyproject.toml's
# requires-python; book/_ext/python_version.py says so in a sentence).
$(STAMP): $(LOCK) requirements.txt pyproject.toml
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) book/_ext/python_version.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	grep -v '^torch==' $(LOCK) > $(VENV)/lock-without-torch.txt
	$(BIN)/python -m pip install -q --no-compile --no-deps $$(grep '^torch==' $(LOCK)) & \
	  $(BIN)/python -m pip install -q --no-compile --no-deps -r $(VENV)/lock-without-torch.txt \
	  && wait $$! || { wait; exit 1; }
	$(BIN)/python -m pip check
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 -x '/tests/' $(VENV)/lib > /dev/null || true
	$(BIN)/python book/_ext/write_lock.py --check requirements.txt $(LOCK)
	@touch $@

# The environment alone (the judge, the notebooks): `python practice/judge.py` then
# finds it by itself.
setup: $(STAMP)
	@echo "The environment is ready: python practice/judge.py"

# The environment and the JavaScript the site serves (book/vendor.sh, mostly
# waiting on the npm registry) are made side by side; each one's output is printed
# when it is done (-O).
ready:
	@$(MAKE) --no-print-directory -j 2 -O $(STAMP) $(VENDOR)

# After changing an exercise's files: the judge refuses files that differ from it.
practice-manifest:
	$(PYTHON) practice/_judge/manifest.py

# pip's own resolver writes the lock (book/_ext/write_lock.py says why): it keeps
# the versions the lock pins, unless UPGRADE=1.
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --dry-run --ignore-installed \
	  --report $(VENV)/lock-report.json -r requirements.txt \
	  $(if $(UPGRADE),,$(if $(wildcard $(LOCK)),-c $(LOCK)))
	$(BIN)/python book/_ext/write_lock.py $(VENV)/lock-report.json > $(LOCK).new
	mv $(LOCK).new $(LOCK)

# JavaScript the site serves itself (widgets, Pyodide), from the npm registry.
$(VENDOR): book/vendor.sh
	bash book/vendor.sh vendor
	@touch $@

book: ready
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo
	@echo "The site is in _build/html. Open _build/html/index.html in a browser,"
	@echo "or serve it: $(BIN)/python -m http.server -d _build/html 8000  (then http://127.0.0.1:8000)"

# The stages of `make test`, in order; it stops at the first that fails, and
# prints how long each took. Two cores: the site's build (one core; from the
# stored outputs, which test-notebooks then proves current) and then the browser's
# visits of it (which wait on pages much of their time and use about one core) run
# in the background ("bg:", in that order) beside every later stage; the library's
# tests, the judge's and the notebooks on the portable kernels (which skips every
# cell that times something) share nothing and run side by side ("+"), each filling
# the others' waits; the notebooks run last with nothing beside them, since their
# timing cells measure this machine. The pytest stages that run many short,
# independent files spread them over two workers (-n 2; a file stays on one worker,
# so its module fixtures are made once). tests/run_stages.sh runs the list.
TEST_STAGES := lint test-budget bg:test-book,test-browser \
  test-unit+test-practice+test-portable test-notebooks

test: ready
	@MAKE="$(MAKE)" bash tests/run_stages.sh $(TEST_STAGES)

# Every launch of ranks opens TCP connections on 127.0.0.1, and torch's c10d names
# each socket's addresses with getnameinfo: a reverse lookup of ::ffff:127.0.0.1,
# which /etc/hosts does not answer, so it goes to the DNS server. Where that server
# drops a query, glibc waits its default 5 s before asking again (resolv.conf(5)):
# measured here, 15 launches in 185 stalled 5 s (c10d's socket.cpp warns "The hostname
# of the client socket cannot be retrieved" when the lookup fails). The tests'
# processes wait 1 s instead (RES_OPTIONS); no test looks up a name on the network.
# And make test runs three to five processes at once on two cores. torch's CPU
# kernels use GNU OpenMP (libgomp), whose threads, after each parallel region, wait
# 300,000 spins before they sleep unless OMP_WAIT_POLICY is PASSIVE (libgomp's
# manual, GOMP_SPINCOUNT); it counts only its own threads against the cores, so
# here a waiting thread spins on a core another test needs. Waiting passively
# changes no result (the same threads split the same work). Measured here, one run
# each: make test 1028 s with it, 1108 s without (runs differ by up to 10%).
TEST_ENV := RES_OPTIONS="timeout:1 attempts:2" OMP_WAIT_POLICY=PASSIVE

test-budget: $(STAMP)
	$(BIN)/python tests/chapter_budget.py

# One style for the library, the judge, the tests and the notebooks' cells
# (configured in pyproject.toml: 88 columns).
LINTED := mylib practice tests notebooks book/_ext book/benchmarks.py

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

format: $(STAMP)
	$(BIN)/ruff format $(LINTED)

test-unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q tests -m "not browser" -n 2 --dist loadfile -p no:cacheprovider --durations=25

test-practice: $(STAMP)
	@if [ -f practice/judge.py ]; then $(TEST_ENV) $(BIN)/python -m pytest -q practice -p no:cacheprovider --durations=10; fi

# nbval re-executes every notebook and compares with its stored outputs, so
# the site (built from stored outputs) is proven current without a 2nd run.
test-notebooks: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q --nbval notebooks -n 2 --dist loadfile --nbval-sanitize-with $(NB_SANITIZE) -p no:cacheprovider --durations=10

# The stored outputs must not depend on the CPU that recorded them: the notebooks
# again, under ATen's portable kernels and MKL's AVX2 code path (book/setup.md, "On
# another CPU"; tests/portable_kernels.py names them). Cells whose outputs are not
# compared are skipped (notebooks/conftest.py), so no cell times anything and two
# notebooks can run at once; so are the cells whose test runs them on those kernels.
PORTABLE_ENV = $(shell $(PYTHON) tests/portable_kernels.py) NBVAL_COMPARED_ONLY=1
test-portable: $(STAMP)
	$(PORTABLE_ENV) $(TEST_ENV) $(BIN)/python -m pytest -q --nbval notebooks -n 2 --dist loadfile \
	  --nbval-sanitize-with $(NB_SANITIZE) -p no:cacheprovider --durations=5

test-book: $(STAMP) $(VENDOR)
	rm -rf _build/html
	$(BIN)/jupyter-book build . -W -n --keep-going

# Only the files that hold browser tests: collecting the others imports torch and
# all the library's tests need (8 s of CPU), to deselect them.
BROWSER_TESTS = $(shell grep -l 'pytest.mark.browser' tests/test_*.py)
test-browser: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q $(BROWSER_TESTS) -m browser -p no:cacheprovider -rs

# Then each notebook gets the kernelspec JupyterLab writes, so that opening it
# in `make lab` does not mark it modified (book/_ext/lab_notebooks.py).
notebooks: $(STAMP)
	for nb in notebooks/*.ipynb; do \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 "$$nb" || exit 1; \
	done
	$(BIN)/python book/_ext/lab_notebooks.py notebooks/*.ipynb

# JupyterLab on copies of the book in .lab/ (git-ignored; book/_ext/lab_copies.py):
# reading and running leave the tracked notebooks as they are, and the copies'
# MyST (glossary terms, cross-references, glued numbers, exercise numbers) reads
# as on the site. A copy you changed is kept; FRESH=1 replaces every copy.
lab-copies: $(STAMP)
	$(BIN)/python book/_ext/lab_copies.py $(if $(FRESH),--fresh)

lab: lab-copies
	IPYTHONDIR=$(CURDIR)/.lab/.ipython $(BIN)/jupyter lab .lab \
	  --LabApp.default_url=/lab/tree/notebooks/00_quickstart.ipynb

bench: $(STAMP)
	$(BIN)/python tests/bench.py

clean:
	rm -rf _build .pytest_cache .hypothesis
