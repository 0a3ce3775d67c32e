"""Every notebook keeps the shape of the series: a title and learning goals, figures, a summary, and
exercises that read task -> hint -> the learner's stub -> an automatic check. The worked solutions are in a
companion notebook, notebooks/solutions/NN_solutions.ipynb, that the lesson links to, each followed by the same
check: a reader scrolling a lesson (on GitHub too) never sees one."""

import re
from pathlib import Path

import nbformat
import pytest

from mha_tutorial import checks
from tools.hygiene import problems
from tools.series import companion

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
    headings = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("### Exercise")]
    assert headings, f"{path.name} has no exercise"
    stubs = [i for i, c in enumerate(nb.cells) if "exercise" in _tags(c)]
    assert len(stubs) == len(headings)
    for heading, stub in zip(headings, stubs, strict=True):
        hint, check = nb.cells[stub - 1], nb.cells[stub + 1]
        assert heading < stub - 1 and "hint" in _tags(hint) and hint.source.startswith("**Hint.**"), hint.source[:100]
        assert not hint.metadata.get("jupyter", {}).get("source_hidden"), "hints are visible"
        assert "raise NotImplementedError" in nb.cells[stub].source and not nb.cells[stub].outputs
        assert _called_checks(check), check.source[:200]


LESSONS_WITH_EXERCISES = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]*_*.ipynb")
    if any("exercise" in _tags(c) for c in nbformat.read(p, as_version=4).cells)
)


def _printed(cells) -> list[str]:
    return [o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs]


@pytest.mark.parametrize("path", LESSONS_WITH_EXERCISES, ids=[p.stem for p in LESSONS_WITH_EXERCISES])
def test_a_lesson_holds_no_solution_and_links_to_its_companion(path):
    nb = nbformat.read(path, as_version=4)
    assert not [i for i, c in enumerate(nb.cells) if "solution" in _tags(c)], "solutions live in the companion"
    assert not re.search(r"^## Solutions", markdown(nb), re.M)
    solutions = companion(path)
    assert solutions.exists(), f"{path.name} has exercises but no {solutions.relative_to(path.parent)}"
    link = f"](solutions/{solutions.name})"
    assert link in nb.cells[-1].source and "try the exercises first" in nb.cells[-1].source, nb.cells[-1].source
    assert not re.search(r"(Solutions|solutions?) (section|are|is) (at the end|below)", markdown(nb))


@pytest.mark.parametrize("path", LESSONS_WITH_EXERCISES, ids=[p.stem for p in LESSONS_WITH_EXERCISES])
def test_the_companion_solves_each_exercise_in_order_each_followed_by_the_same_check(path):
    lesson = nbformat.read(path, as_version=4)
    solutions = companion(path)
    nb = nbformat.read(solutions, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Solutions")
    assert f"](../{path.name})" in nb.cells[0].source, "the companion links back to its lesson"
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == next(c for c in lesson.cells if c.cell_type == "code").source, "the lesson's set-up"
    learner_checks = [lesson.cells[i + 1] for i, c in enumerate(lesson.cells) if "exercise" in _tags(c)]
    solved = [i for i, c in enumerate(nb.cells) if "solution" in _tags(c)]
    assert not [i for i, c in enumerate(nb.cells) if "exercise" in _tags(c)]
    assert [nb.cells[i + 1].source for i in solved] == [c.source for c in learner_checks]
    assert all(_called_checks(nb.cells[i + 1]) for i in solved)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert problems(solutions) == []
    checks_run = [c for c in nb.cells if _called_checks(c)]
    assert checks_run and all("✓ check_" in "".join(_printed([c])) for c in checks_run), solutions.name


def test_every_companion_belongs_to_a_lesson():
    folder = Path(__file__).resolve().parents[2] / "notebooks" / "solutions"
    assert sorted(folder.glob("*.ipynb")) == [companion(p) for p in LESSONS_WITH_EXERCISES]


def test_no_check_passes_in_a_lesson(notebook):
    """Committed outputs: every learner check reports "not attempted yet" (the companions' checks pass)."""
    path, nb = notebook
    before = [nb.cells[i + 1] for i, c in enumerate(nb.cells) if "exercise" in _tags(c)]
    assert all("not attempted yet" in "".join(_printed([c])) for c in before), path.name
    assert not any("✓ check_" in text for text in _printed(nb.cells))


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
