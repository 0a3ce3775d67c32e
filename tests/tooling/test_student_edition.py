"""The student edition (make student): the lessons with their outputs cleared.

The worked solutions live in the companions (notebooks/solutions/), so a student edition is its lesson cell for
cell, outputs cleared: every cell it keeps is a cell of the full notebook, which test_hosted.py executes from a plain
wheel install in the graders' strict mode (every unattempted exercise's check fails with "not attempted", every other
cell runs). So the student edition runs as far as a learner can take it, and an untouched one fails every check when
graded. A lesson that holds a solution cell is refused.
"""

import re

import nbformat
import pytest

from tools.series import series_notebooks
from tools.student import student_edition

NOTEBOOKS = series_notebooks()


def test_outputs_are_cleared_and_the_original_is_not_touched():
    nb = nbformat.v4.new_notebook()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    stub = code("def f(): raise NotImplementedError")
    stub.metadata["tags"] = ["exercise"]
    ran = code("checks.check_f(f)", outputs=[nbformat.v4.new_output("stream", text="not attempted")])
    nb.cells = [md("### Exercise 1"), stub, ran, md("Worked solutions: [solutions/01_solutions.ipynb](...)")]
    student, exercises = student_edition(nb)
    assert exercises == 1 and [c.source for c in student.cells] == [c.source for c in nb.cells]
    assert student.cells[2].outputs == [] and nb.cells[2].outputs  # the original is not touched


def test_a_lesson_with_a_solution_cell_is_refused():
    nb = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell("def f(): return 1")
    solution.metadata["tags"] = ["solution"]
    nb.cells = [nbformat.v4.new_markdown_cell("## Solutions"), solution]
    with pytest.raises(
        ValueError, match=r"cells \[1\] are tagged 'solution': worked solutions belong in the companion"
    ):
        student_edition(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_student_edition_is_its_lesson_without_outputs(path):
    full = nbformat.read(path, as_version=4)
    nb, count = student_edition(full)
    tags = [c.metadata.get("tags", []) for c in full.cells]
    assert count == sum("exercise" in t for t in tags)
    assert count > 0 or path.name[2] != "_", f"{path.name}: a core notebook without exercises"
    link = re.compile(r"\[solutions/[^]]+\]\(solutions/[^)]+\)")
    for student_cell, lesson_cell in zip(nb.cells, full.cells, strict=True):
        if link.search(lesson_cell.source):  # the link to the companion, dead in a handout, names the answer key
            assert "](solutions/" not in student_cell.source and "the answer key" in student_cell.source
        else:
            assert student_cell.source == lesson_cell.source
    assert count == 0 or any(link.search(c.source) for c in full.cells), f"{path.name}: no link to its solutions"
    assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)
    assert all(not c.get("outputs") for c in nb.cells), "outputs are cleared"


def test_a_notebook_without_exercises_passes_through_with_outputs_cleared():
    nb = nbformat.v4.new_notebook()
    ran = nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1")])
    nb.cells = [nbformat.v4.new_markdown_cell("# A deep dive"), ran]
    student, exercises = student_edition(nb)
    assert exercises == 0 and len(student.cells) == 2 and student.cells[1].outputs == []
