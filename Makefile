# The two commands of the README. Both create .venv if it is missing and install the pinned
# requirements (again only when requirements.txt changes), so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Stages call `python` and `dvc`: the venv's, whoever runs make.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: lock release readme test test-fast lint env vulkan keys real-width bench gpu-bench gpu-parts gpu-mixed bundle-memory weights-bench quantization-trace train-tiny train-tiny-check corpus-manifest

env: $(STAMP) vulkan .dvc/plots.html

# The page `dvc plots show` fills (.dvc/config's plots.html_template), with Vega inline: plots render offline.
.dvc/plots.html: $(STAMP) scripts/pipeline/plots_page.py
	$(VENV)/bin/python -m scripts.pipeline.plots_page $@

# A Vulkan adapter for LiteRT's GPU accelerator (verify_gpu): Mesa's lavapipe >= 25 where no GPU is
# present, installed as root on Debian 12/13; checked on every run (fast when it is there).
vulkan:
	bash scripts/vulkan_driver.sh

$(STAMP): requirements.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# the `clef` command, editable: it runs this checkout's code
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# requirements.txt again from requirements.in, in a venv of its own (pip-tools is not part of the lock):
# existing pins are kept; `make lock LOCK_ARGS="--upgrade-package transformers"` moves one.
LOCK_VENV := $(VENV)/lock
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || ($(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/python -m pip install --quiet pip-tools==7.7.0)
	$(LOCK_VENV)/bin/pip-compile --quiet --allow-unsafe --strip-extras --no-emit-find-links --no-emit-index-url \
		--no-emit-trusted-host $(LOCK_ARGS) --output-file requirements.txt requirements.in

release: env
	dvc repro
	python -m scripts.pipeline.readme

# The generated tables and pictures of README.md and docs/ again from the workspace's results/ (after a dvc repro of your own).
readme: env
	python -m scripts.pipeline.readme

# A key pair to sign releases with, outside the repository (docs/release.md, "Signing"): KEYS=DIR to choose
# where; the private key is encrypted when $$CLEF_SIGNING_KEY_PASSWORD is set.
KEYS ?= $(HOME)/.config/clef-litert
keys: env
	clef keys $(KEYS)

# Format and lint with ruff (pinned in requirements.txt, configured in pyproject.toml): first in both tiers.
lint: env
	ruff check
	ruff format --check

# The fast tier first, so a broken module fails in minutes, then the tests of the pipeline run and the
# graph conversions (marked by tests/conftest.py): together every test, each once.
test: env lint
	python -m pytest -q -m "not pipeline and not slow"
	python -m pytest -q --durations=30 -m "pipeline or slow"

# The fast tier, for a change to one module: every test but those that need the whole pipeline run
# (marked `pipeline` by tests/conftest.py) or convert graphs (marked `slow`).
test-fast: env lint
	python -m pytest -q -m "not pipeline and not slow"

# The whole pipeline on the real-width synthetic checkpoint (clef-flash's widths, 4 layers) in its own
# workspace, artifacts/real-width/, then results/bench.json. A benchmark: not part of `make test`.
real-width: env
	python -m scripts.bench.real_width

# results/bench.json again from the workspaces as they are (after make release and make real-width).
bench: env
	python -m scripts.bench.report --real-width artifacts/real-width

# results/gpu_bench.json: the stock loop kernel and litert-torch's own GatedDeltaNet on the GPU
# accelerator beside our form (after make release). A benchmark: not part of `make test`.
gpu-bench: env
	python -m scripts.bench.gpu_bench

# results/gpu_parts.json: the first GatedDeltaNet taken apart on the GPU accelerator in fp16, one-op
# graphs, and the split-K / series-log1p candidates measured (after make release). A benchmark.
gpu-parts: env
	python -m scripts.bench.gpu_parts

# results/gpu_mixed.json: the GPU accelerator's mixed mode against the torch-float16 floor over perturbed
# copies of verify_gpu's records, and the first decoder layer traced part by part (after make release).
gpu-mixed: env
	python -m scripts.bench.gpu_mixed

# results/bundle_memory.json: memory with every signature of a bundle compiled against one graph's, on a toy
# whose weights dominate (64 MiB), CPU and GPU accelerators. A benchmark: not part of `make test`.
bundle-memory: env
	python -m scripts.bench.bundle_memory

# results/weights.json: the L=64 row graph at every weights precision side by side, and every graph of the
# release against its twin at the other of fp32 / fp16 (after make release). A benchmark: not part of `make test`.
weights-bench: env
	python -m scripts.bench.weights_bench

# results/quantization_trace.json: which Linears cost the decisions at int8, int4 and int4b32, each role and
# layer quantized alone in torch (after make release). A benchmark: not part of `make test`.
quantization-trace: env
	python -m scripts.bench.quantization_trace

# The embedded checkpoint trained on the corpus's train part (scripts/checkpoint/train_tiny.py, ~25 min on 2 quiet cores, 41 min beside other work),
# then its held-out quality beside a bigram (results/tiny_quality.json). Committed: make release never retrains.
# `make train-tiny-check` retrains and names the first tensor that differs from the committed ones.
train-tiny: env
	python -m scripts.checkpoint.train_tiny
	python -m scripts.checkpoint.tiny_quality

train-tiny-check: env
	python -m scripts.checkpoint.train_tiny --check

# scripts/checkpoint/corpus.json again from the installed package (after a lock file change moves it).
corpus-manifest: env
	python -m scripts.checkpoint.corpus
