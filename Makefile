# make test: set up .venv from the project's own files, then run the test suite.
# make demo: set up, then train and use the embedded translation demo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser test lint format demo bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,hf,ctranslate2,bench]'
	touch $(STAMP)

install: $(STAMP)

# The attention explorer is tested in a real headless browser: Debian's Chromium and its driver.
# Installed when missing and this user may (root, apt-get present); otherwise those tests skip.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	   chromium chromium-driver >/dev/null) || \
	  echo "no Chromium: the browser tests will be skipped"; }

# One thread per test worker: two workers of two threads each would fight over two cores.
test: $(STAMP) browser
	$(BIN)/ruff check src tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks

demo: $(STAMP)
	$(BIN)/qkv demo --out runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache
