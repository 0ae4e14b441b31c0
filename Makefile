# The two commands of the README. Both create .venv if it is missing and install the pinned
# requirements (again only when requirements.txt changes), so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Stages call `python` and `dvc`: the venv's, whoever runs make.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: release test env real-width bench

env: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# the `clef` command, editable: it runs this checkout's code
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

release: $(STAMP)
	dvc repro

test: $(STAMP)
	python -m pytest -q

# The whole pipeline on the real-width synthetic checkpoint (clef-flash's widths, 4 layers) in its own
# workspace, artifacts/real-width/, then results/bench.json. A benchmark: not part of `make test`.
real-width: $(STAMP)
	python -m scripts.real_width

# results/bench.json again from the workspaces as they are (after make release and make real-width).
bench: $(STAMP)
	python -m scripts.bench --real-width artifacts/real-width
