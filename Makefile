# prefixscan: two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install demo test lint bench clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install prefixscan with test extras

demo: $(STAMP)  ## analyze the sample logs and print the summary and the run directory
	$(BIN)/prefixscan analyze sample_logs/chat.jsonl sample_logs/chat.parquet -o runs/demo --force

test: $(STAMP)  ## run the test suite
	$(BIN)/python -m pytest

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check prefixscan tests bench

bench: $(STAMP)  ## benchmarks (never part of make test); writes bench/results.md
	$(BIN)/python bench/run.py

clean:  ## remove the venv and demo runs
	rm -rf $(VENV) runs
