"""The student edition (make student): the notebooks without their Solutions sections, and it runs.

Each notebook's student edition is executed top to bottom with nbclient, as a learner without the
repository would run it: in a fresh venv holding the package installed from its wheel, from a folder
outside the checkout (so this also proves that every notebook works from a plain install), and in the
graders' strict mode (MHA_TUTORIAL_STRICT_CHECKS=1): every check cell must fail with "not attempted",
every other cell must run without error. (Without strict mode the same checks print "not attempted yet":
the committed notebooks show that, under strict nbval.)
"""

import os
import subprocess
from pathlib import Path

import nbformat
import pytest

from tools.site import series_notebooks
from tools.student import student_edition

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = series_notebooks()
EXECUTE = """
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(
    nb, timeout=600, kernel_name="python3", allow_errors=True,
    resources={"metadata": {"path": str(Path(sys.argv[1]).parent)}},
).execute()
nbformat.write(nb, sys.argv[1])
"""


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
def test_student_edition_in_strict_mode_fails_every_check_and_nothing_else(path, tmp_path, wheel_python):
    full = nbformat.read(path, as_version=4)
    nb, count = student_edition(full)
    assert count == sum("solution" in c.metadata.get("tags", []) for c in full.cells)
    assert count > 0 or path.name[2] != "_", f"{path.name}: a core notebook without exercises"
    exercises = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
    assert len(exercises) == count
    # Run it as a learner without the repository would (the package installed from its wheel, not editable,
    # the notebook in a folder of its own) and as a grader does: strict mode, errors allowed so every cell runs.
    python, _ = wheel_python
    copy = tmp_path / path.name
    nbformat.write(nb, copy)
    env = {**os.environ, "MHA_TUTORIAL_STRICT_CHECKS": "1"}
    result = subprocess.run(
        [python, "-c", EXECUTE, str(copy)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    nb = nbformat.read(copy, as_version=4)
    checks_of_exercises = {
        id(nb.cells[i + 1]) for i, c in enumerate(nb.cells) if "exercise" in c.metadata.get("tags", [])
    }
    failed_checks = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if id(cell) in checks_of_exercises:
            assert [e.ename for e in errors] == ["CheckFailed"], cell.source[:200]
            assert "not attempted" in errors[0].evalue
            failed_checks += 1
        else:
            assert not errors, f"{path.name}: a cell that is not a check failed: {errors[0].ename}: {errors[0].evalue}"
    assert failed_checks == count


def test_a_notebook_without_exercises_passes_through_with_outputs_cleared():
    nb = nbformat.v4.new_notebook()
    ran = nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1")])
    nb.cells = [nbformat.v4.new_markdown_cell("# A deep dive"), ran]
    student, dropped = student_edition(nb)
    assert dropped == 0 and len(student.cells) == 2 and student.cells[1].outputs == []
