# Two commands for a newcomer: `make lab` (or `make run`) to use the series, `make test` to check it.
# Everything is installed into .venv from requirements.txt; nothing outside it is touched.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: install lab run student test lint unit nbval outputs clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name mha-tutorial --display-name "Python (mha-tutorial)" >/dev/null
	touch $(STAMP)

## Work through the series in JupyterLab.
# (Jupyter refuses to run as root unless told to; containers and some lab images run as root.)
lab: install
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## Execute every notebook headless (on the GPU when there is one) and render the site build/site/index.html.
run: install
	$(PY) -m mha_tutorial.site --execute --out build/site $(NOTEBOOKS)

## Write the student edition to build/student/: solutions replaced by stubs, checks kept.
student: install
	$(PY) -m mha_tutorial.student --out build/student $(NOTEBOOKS)

## Lint, unit tests (student edition and site included), then strict nbval over every notebook.
test: lint unit nbval

lint: install
	$(VENV)/bin/ruff check mha_tutorial tests notebooks
	$(VENV)/bin/ruff format --check mha_tutorial tests notebooks
	$(PY) -m mha_tutorial.hygiene $(NOTEBOOKS)

unit: install
	$(PY) -m pytest -q tests

nbval: install
	$(PY) -m pytest -q $(NBVAL) $(NOTEBOOKS)

## Re-execute the notebooks in place to refresh their committed outputs (run on the CPU, as CI does).
outputs: install
	CUDA_VISIBLE_DEVICES= $(PY) -m mha_tutorial.run_notebooks --inplace $(NOTEBOOKS)

clean:
	rm -rf build .pytest_cache .hypothesis
