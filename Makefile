# make test: set up .venv from the project's own files, then run the test suite.
# make demo: set up, then train and use the embedded translation demo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser test fuzz lint format demo bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,hf,ctranslate2,bench,serve]'
	touch $(STAMP)

install: $(STAMP)

# The attention explorer is tested in a real headless browser: Debian's Chromium and its driver.
# Installed when missing and this user may (root, apt-get present); otherwise `make test` stops
# here, unless QKV_SKIP_BROWSER=1 says to skip those tests knowingly.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	   chromium chromium-driver >/dev/null; } || \
	[ "$$QKV_SKIP_BROWSER" = 1 ] || \
	{ echo "make: the browser tests need chromium and chromedriver (apt-get install" \
	  "chromium chromium-driver); set QKV_SKIP_BROWSER=1 to skip them knowingly" >&2; exit 1; }

# One thread per test worker: two workers of two threads each would fight over two cores.
test: $(STAMP) browser
	$(BIN)/ruff check src tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests

# Every reader and prediction command on 1,000 random or malformed inputs each (15,000 cases;
# `make test` runs 15 each).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests/test_fuzz.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks

demo: $(STAMP)
	$(BIN)/qkv demo --out runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache
