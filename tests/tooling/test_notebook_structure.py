"""Every notebook keeps the shape of the series: a title and learning goals, figures, a summary, and
exercises whose solutions sit in collapsed cells followed by a cell that runs an automatic check."""

import re
from pathlib import Path

import nbformat
import pytest

from mha_tutorial import checks
from tools.hygiene import problems

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request):
    return request.param, nbformat.read(request.param, as_version=4)


def markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_opens_with_a_title_and_learning_goals(notebook):
    _, nb = notebook
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    opening = "\n".join(c.source for c in nb.cells[:3] if c.cell_type == "markdown")
    assert "you will be able to" in opening


def test_has_a_summary_and_figures(notebook):
    _, nb = notebook
    assert re.search(r"^## Summary", markdown(nb), re.M)
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "a notebook of this series draws at least one figure"


def test_every_exercise_has_a_collapsed_solution_and_a_check(notebook):
    path, nb = notebook
    exercises = re.findall(r"^### Exercise \d+", markdown(nb), re.M)
    assert exercises, f"{path.name} has no exercise"
    for i, cell in enumerate(nb.cells):
        if "solution" not in cell.metadata.get("tags", []):
            continue
        assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, "solutions start collapsed"
        assert "# BEGIN SOLUTION" in cell.source and "# END SOLUTION" in cell.source and "# HINT:" in cell.source
        following = next(c for c in nb.cells[i + 1 :] if c.cell_type == "code")
        called = re.findall(r"checks\.(check_\w+)\(", following.source)
        assert called and all(name in checks.__all__ for name in called), following.source[:200]
    solutions = sum("solution" in c.metadata.get("tags", []) for c in nb.cells)
    assert solutions == len(exercises)


def test_committed_outputs_are_clean(notebook):
    path, _ = notebook
    assert problems(path) == []


def test_kernel_is_the_plain_python3_kernel(notebook):
    _, nb = notebook
    assert nb.metadata["kernelspec"]["name"] == "python3"
