"""The student edition (make student): the notebooks without their Solutions sections.

A student edition is its notebook cut at the `## Solutions` heading, outputs cleared: every cell it keeps is a
cell of the full notebook, which test_hosted.py executes from a plain wheel install in the graders' strict mode
(every unattempted exercise's check fails with "not attempted", every other cell runs). So the student edition
runs as far as a learner can take it, and an untouched one fails every check when graded.
"""

import nbformat
import pytest

from tools.series import series_notebooks
from tools.student import student_edition

NOTEBOOKS = series_notebooks()


def test_the_solutions_section_is_left_out_and_outputs_cleared():
    nb = nbformat.v4.new_notebook()
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    solution = code("def f(): return 1")
    solution.metadata["tags"] = ["solution"]
    ran = code("checks.check_f(f)", outputs=[nbformat.v4.new_output("stream", text="not attempted")])
    nb.cells = [md("### Exercise 1"), code("def f(): raise NotImplementedError"), ran, md("## Solutions"), solution]
    student, dropped = student_edition(nb)
    assert dropped == 1 and [c.source for c in student.cells] == [c.source for c in nb.cells[:3]]
    assert student.cells[2].outputs == [] and nb.cells[2].outputs  # the original is not touched


def test_a_solution_before_the_heading_or_no_heading_is_refused():
    nb = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell("def f(): return 1")
    solution.metadata["tags"] = ["solution"]
    nb.cells = [solution, nbformat.v4.new_markdown_cell("## Solutions")]
    with pytest.raises(ValueError, match=r"cells \[0\] are tagged 'solution' but come before"):
        student_edition(nb)
    nb.cells = [solution]
    with pytest.raises(ValueError, match="expected one '## Solutions' heading, found 0"):
        student_edition(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_student_edition_is_its_notebook_up_to_the_solutions(path):
    full = nbformat.read(path, as_version=4)
    nb, count = student_edition(full)
    tags = [c.metadata.get("tags", []) for c in full.cells]
    assert count == sum("solution" in t for t in tags)
    assert count > 0 or path.name[2] != "_", f"{path.name}: a core notebook without exercises"
    assert [c.source for c in nb.cells] == [c.source for c in full.cells[: len(nb.cells)]]
    assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)
    assert sum("exercise" in c.metadata.get("tags", []) for c in nb.cells) == count
    assert all(not c.get("outputs") for c in nb.cells), "outputs are cleared"


def test_a_notebook_without_exercises_passes_through_with_outputs_cleared():
    nb = nbformat.v4.new_notebook()
    ran = nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1")])
    nb.cells = [nbformat.v4.new_markdown_cell("# A deep dive"), ran]
    student, dropped = student_edition(nb)
    assert dropped == 0 and len(student.cells) == 2 and student.cells[1].outputs == []
