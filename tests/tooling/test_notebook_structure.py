"""Every notebook keeps the shape of the series: a title and learning goals, figures, a summary, and
exercises that read task -> hint -> the learner's stub -> an automatic check, and worked solutions in a
Solutions section at the end, each checked too."""

import re
from pathlib import Path

import nbformat
import pytest

from mha_tutorial import checks
from tools.hygiene import problems
from tools.student import solutions_start

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


def _tags(cell) -> list:
    return cell.metadata.get("tags", [])


def _called_checks(cell) -> list:
    called = re.findall(r"checks\.(check_\w+)\(", cell.source) if cell.cell_type == "code" else []
    assert all(name in checks.__all__ for name in called), cell.source[:200]
    return called


def test_every_exercise_reads_task_hint_stub_check(notebook):
    """Task, a visible hint cell, the learner's stub (NotImplementedError, no solution), then the check."""
    path, nb = notebook
    start = solutions_start(nb)
    headings = [
        i for i, c in enumerate(nb.cells[:start]) if c.cell_type == "markdown" and c.source.startswith("### Exercise")
    ]
    assert headings, f"{path.name} has no exercise"
    stubs = [i for i, c in enumerate(nb.cells[:start]) if "exercise" in _tags(c)]
    assert len(stubs) == len(headings)
    for heading, stub in zip(headings, stubs, strict=True):
        hint, check = nb.cells[stub - 1], nb.cells[stub + 1]
        assert heading < stub - 1 and "hint" in _tags(hint) and hint.source.startswith("**Hint.**"), hint.source[:100]
        assert not hint.metadata.get("jupyter", {}).get("source_hidden"), "hints are visible"
        assert "raise NotImplementedError" in nb.cells[stub].source and not nb.cells[stub].outputs
        assert _called_checks(check), check.source[:200]


def test_solutions_come_last_folded_and_each_is_checked(notebook):
    path, nb = notebook
    start = solutions_start(nb)
    learner_checks = [
        name
        for i, c in enumerate(nb.cells[:start])
        if "exercise" in _tags(c)
        for name in _called_checks(nb.cells[i + 1])
    ]
    solutions = [i for i, c in enumerate(nb.cells) if "solution" in _tags(c)]
    assert len(solutions) == len(learner_checks)
    for i in solutions:
        assert nb.cells[i].metadata.get("jupyter", {}).get("source_hidden") is True, "solutions start collapsed"
        assert _called_checks(nb.cells[i + 1]), f"{path.name}: solution cell {i} is not followed by its check"
    assert sorted(name for i in solutions for name in _called_checks(nb.cells[i + 1])) == sorted(learner_checks)


def test_no_check_passes_before_the_solutions(notebook):
    """Committed outputs: every learner check reports "not attempted yet", every solution's check passes."""
    path, nb = notebook
    start = solutions_start(nb)

    def printed(cells):
        return [o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs]

    before = [nb.cells[i + 1] for i, c in enumerate(nb.cells[:start]) if "exercise" in _tags(c)]
    assert all("not attempted yet" in "".join(printed([c])) for c in before), path.name
    assert not any("✓ check_" in text for text in printed(nb.cells[:start]))
    after = [c for c in nb.cells[start:] if _called_checks(c)]
    assert all("✓ check_" in "".join(printed([c])) for c in after), path.name


def test_committed_outputs_are_clean(notebook):
    path, _ = notebook
    assert problems(path) == []


def test_kernel_is_the_plain_python3_kernel(notebook):
    _, nb = notebook
    assert nb.metadata["kernelspec"]["name"] == "python3"


DEEP_DIVES = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9][a-z]_*.ipynb"))


@pytest.mark.parametrize("path", DEEP_DIVES, ids=[p.stem for p in DEEP_DIVES])
def test_a_deep_dive_is_optional_linked_from_its_core_notebook_and_links_back(path):
    (core,) = path.parent.glob(f"{path.name[:2]}_*.ipynb")
    assert path.name in markdown(nbformat.read(core, as_version=4)), f"{core.name} does not link to {path.name}"
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    opening = "\n".join(c.source for c in nb.cells[:3] if c.cell_type == "markdown")
    assert "optional" in opening.lower() and core.name in opening
    assert problems(path) == []
