"""The nbgrader course (make nbgrader): its transformation, and the course run through nbgrader as a class would.

One fixture writes the course for notebook 03 (the fastest notebook with exercises), releases it with
``nbgrader generate_assignment``, autogrades four submissions and writes their feedback:

* ``untouched``: the released notebook as handed out; it must score 0 (strict checks);
* ``correct``: every stub replaced by the worked solution of the companion notebook; full marks;
* ``mistake``: the same, but exercise 1 folds the rows head-major, a classic; the other two points, and the
  check's diagnosis in the feedback;
* ``tampered``: untouched stubs, the strict switch deleted from every test cell and switched off again in an
  answer cell; nbgrader restores the locked test cells, which switch strict mode back on, so still 0.

The strict switch is not set in nbgrader's environment: the test cells must set it themselves.
"""

from __future__ import annotations

import ast
import copy
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbgrader.api import Gradebook

from tools.nbgrader_course import (
    BEGIN,
    CODE_STUB,
    COURSE_ID,
    END,
    STRICT,
    STRICT_PREFIX,
    assignment,
    main,
    pair_exercises,
    write_course,
)
from tools.series import companion
from tools.student import has_tag

ROOT = Path(__file__).resolve().parents[2]
SERIES = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # core notebooks and deep dives
NOTEBOOK = ROOT / "notebooks" / "03_splitting_heads.ipynb"
ASSIGNMENT = NOTEBOOK.stem
MISTAKE = "folded head-major (row h*B + b)"
WRONG_SEQ_FIRST = """def my_transpose_qkv_seq_first(X, num_heads):
    T, B, D = X.shape  # permutes to (H, B, T, d): the rows come out head-major
    return X.reshape(T, B, num_heads, D // num_heads).permute(2, 1, 0, 3).reshape(B * num_heads, T, D // num_heads)
"""
SWITCH_OFF = f'\nimport os\n\nos.environ["{STRICT}"] = "0"\n'


def name_of(cell) -> str:
    return ast.parse(cell.source).body[0].name


def run_nbgrader(course: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != STRICT}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # nbgrader runs `alembic`
    env["JUPYTER_CONFIG_DIR"] = str(course / ".jupyter")  # no personal Jupyter or nbgrader configuration
    env["OMP_NUM_THREADS"] = "1"  # tiny models: one thread each is fastest, as in make test
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


def submission(released, answers: dict[str, str], tamper: bool = False):
    nb = copy.deepcopy(released)
    for cell in nb.cells:
        nbg = cell.metadata.get("nbgrader", {})
        if nbg.get("solution") and name_of(cell) in answers:
            cell.source = answers[name_of(cell)]
        elif tamper and nbg.get("solution"):
            cell.source += SWITCH_OFF
        elif tamper and nbg.get("grade"):
            cell.source = cell.source.replace(STRICT_PREFIX, "")
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    write_course(root, [NOTEBOOK])
    run_nbgrader(root, "generate_assignment", ASSIGNMENT)
    released = nbformat.read(root / "release" / ASSIGNMENT / NOTEBOOK.name, as_version=4)
    full = nbformat.read(NOTEBOOK, as_version=4)
    solved = nbformat.read(companion(NOTEBOOK), as_version=4)
    solutions = {name_of(c): c.source for c in solved.cells if has_tag(c, "solution")}
    students = {
        "untouched": submission(released, {}),
        "correct": submission(released, solutions),
        "mistake": submission(released, {**solutions, "my_transpose_qkv_seq_first": WRONG_SEQ_FIRST}),
        "tampered": submission(released, {}, tamper=True),
    }
    for student, nb in students.items():
        folder = root / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / NOTEBOOK.name)
    run_nbgrader(root, "autograde", ASSIGNMENT)
    run_nbgrader(root, "generate_feedback", ASSIGNMENT)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id=COURSE_ID) as gb:
        scores = {
            s: (gb.find_submission(ASSIGNMENT, s).score, gb.find_submission(ASSIGNMENT, s).max_score) for s in students
        }
        grades = {
            s: {g.name: g.score for g in gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, s).grades}
            for s in students
        }
    feedback = {s: (root / "feedback" / s / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text() for s in students}
    return SimpleNamespace(released=released, full=full, solved=solved, scores=scores, grades=grades, feedback=feedback)


def test_an_untouched_notebook_scores_zero(course):
    assert course.scores["untouched"] == (0, 3)
    assert "not attempted (Exercise 1: not written yet)" in course.feedback["untouched"]


def test_the_worked_solutions_score_full_marks(course):
    assert course.scores["correct"] == (3, 3)


def test_one_mistake_costs_its_point_and_the_feedback_names_it(course):
    assert course.scores["mistake"] == (2, 3)
    assert course.grades["mistake"] == {
        "ex1_my_transpose_qkv_seq_first_check": 0,
        "ex2_my_expand_kv_heads_check": 1,
        "ex3_my_transpose_output_check": 1,
    }
    assert MISTAKE in course.feedback["mistake"]
    assert MISTAKE not in course.feedback["correct"]


def test_editing_the_locked_test_cells_does_not_switch_strict_mode_off(course):
    assert course.scores["tampered"] == (0, 3)


def test_the_released_notebook_keeps_the_stubs_and_holds_no_solution(course):
    stubs = [c for c in course.full.cells if has_tag(c, "exercise")]
    answers = [c for c in course.released.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(answers) == len(stubs) == 3
    for stub, answer in zip(stubs, answers, strict=True):
        lines = answer.source.split("\n")
        assert [line.strip() for line in lines].count(CODE_STUB) == 1
        assert [line for line in lines if line.strip() != CODE_STUB] == stub.source.split("\n")
    released = "\n".join(c.source for c in course.released.cells)
    assert "BEGIN SOLUTION" not in released and "## Solutions" not in released
    for solution in (c for c in course.solved.cells if has_tag(c, "solution")):
        body = [line.strip() for line in solution.source.split("\n")[1:] if line.strip()]
        assert not [line for line in body if line in released], name_of(solution)
    assert sum(has_tag(c, "hint") for c in course.released.cells) == 3
    assert all(not c.get("outputs") for c in course.released.cells)


def test_the_released_test_cells_are_locked_and_strict(course):
    tests = [c for c in course.released.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(tests) == 3
    for cell in tests:
        assert cell.metadata.nbgrader.locked and cell.metadata.nbgrader.points == 1
        assert cell.metadata.editable is False and cell.metadata.deletable is False
        assert cell.source.startswith(STRICT_PREFIX) and "checks.check_" in cell.source


# The transformation on small synthetic notebooks.
md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell


def tagged(cell, tag):
    cell.metadata["tags"] = [tag]
    return cell


def stub(name="f", args="x", doc='    """Twice x."""\n'):
    return tagged(
        code(f"# Exercise: your code here.\ndef {name}({args}):\n{doc}    raise NotImplementedError('not yet')"),
        "exercise",
    )


def solution(name="f", body="    y = 2 * x\n    return y", args="x"):
    return tagged(code(f"def {name}({args}):\n{body}"), "solution")


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def exercise(name="f", **kwargs):
    return [md(f"### Exercise: {name}"), tagged(md("**Hint.**"), "hint"), stub(name, **kwargs), code(f"check({name})")]


def solved(name="f", **kwargs):
    return [solution(name, **kwargs), code(f"check({name})")]


def test_the_answer_is_the_stub_with_the_solution_body_between_the_markers():
    ran = code("check(f)", outputs=[nbformat.v4.new_output("stream", text="not attempted")])
    nb = notebook(*exercise()[:3], ran)
    source, count = assignment(nb, notebook(*solved()))
    assert count == 1 and len(source.cells) == 4 and nb.cells[3].outputs  # the original untouched
    answer, check = source.cells[2], source.cells[3]
    assert answer.source == (
        "# Exercise: your code here.\ndef f(x):\n"
        f'    """Twice x."""\n    {BEGIN}\n    y = 2 * x\n    return y\n    {END}\n'
        "    raise NotImplementedError('not yet')"
    )
    assert answer.metadata.nbgrader == {
        "grade": False,
        "grade_id": "ex1_f",
        "locked": False,
        "schema_version": 3,
        "solution": True,
        "task": False,
    }
    assert check.source == STRICT_PREFIX + "check(f)" and check.outputs == []
    assert check.metadata.nbgrader["grade"] and check.metadata.nbgrader["locked"]
    assert check.metadata.nbgrader["points"] == 1 and check.metadata.nbgrader["grade_id"] == "ex1_f_check"
    assert "nbgrader" not in source.cells[1].metadata  # the hint stays as it is


def test_solutions_are_paired_by_name_whatever_their_order():
    nb, answers = notebook(*exercise("f"), *exercise("g")), notebook(*solved("g"), *solved("f"))
    assert pair_exercises(nb, answers) == [(2, 2), (6, 0)]
    source, _ = assignment(nb, answers)
    assert [c.metadata.nbgrader["grade_id"] for c in source.cells if "nbgrader" in c.metadata] == [
        "ex1_f",
        "ex1_f_check",
        "ex2_g",
        "ex2_g_check",
    ]


def test_a_multiline_signature_and_another_indentation_are_handled():
    args = "\n    x,\n    scale: dict[str, int] = {'a': 1},\n"
    nb, answers = notebook(*exercise(args=args, doc="")), notebook(*solved(args=args, body="  return x"))
    answer = assignment(nb, answers)[0].cells[2].source
    assert answer.endswith(f"):\n    {BEGIN}\n    return x\n    {END}\n    raise NotImplementedError('not yet')")


@pytest.mark.parametrize(
    ("cells", "answers", "message"),
    [
        ([*exercise("f"), *exercise("f")], solved("f"), "cells 2 and 6 .* define f: ambiguous"),
        (exercise("f"), [*solved("f"), *solved("f")], "cells 0 and 2 .* define f: ambiguous"),
        (exercise("f"), solved("g"), r"without a solution: \['f'\].*without an exercise: \['g'\]"),
        (exercise("f"), [solution("f"), code("check(g)")], "not followed by the same check"),
        (exercise("f")[:3], solved("f"), "cell 2 is not followed by a code cell"),
        (exercise("f", args="x, y"), solved("f"), "different signatures"),
        (exercise("f"), solved("f", body="    print(x)"), "must end with a return"),
        (exercise("f"), solved("f", body="    return x\nf(1)"), "one function definition"),
        (exercise("f"), solved("f", body="    return x +"), "not valid Python"),
        (
            [tagged(code("def f(x):\n    return 0"), "exercise"), code("check(f)")],
            solved("f"),
            "must raise NotImplementedError",
        ),
        ([*exercise("f"), *solved("f")], solved("f"), r"cells \[4\] of the lesson are tagged 'solution'"),
        (exercise("f"), None, "needs its companion notebook"),
    ],
    ids=[
        "two-stubs-one-name",
        "two-solutions-one-name",
        "names-differ",
        "checks-differ",
        "no-check",
        "signatures-differ",
        "no-return",
        "more-than-a-function",
        "syntax-error",
        "stub-does-not-raise",
        "solution-in-the-lesson",
        "no-companion",
    ],
)
def test_bad_input_is_refused(cells, answers, message):
    with pytest.raises(ValueError, match=message):
        assignment(notebook(*cells), None if answers is None else notebook(*answers))


def without_region(source: str) -> str:
    """The answer cell as generate_assignment leaves it, less its # YOUR CODE HERE line."""
    lines, keep = source.split("\n"), True
    kept = []
    for line in lines:
        keep = keep and line.strip() != BEGIN
        if keep:
            kept.append(line)
        keep = keep or line.strip() == END
    return "\n".join(kept)


def test_the_course_has_an_assignment_for_every_notebook_with_exercises(tmp_path, capsys):
    assert main(["--out", str(tmp_path), *map(str, SERIES)]) == 0
    config = (tmp_path / "nbgrader_config.py").read_text()
    assert f'course_id = "{COURSE_ID}"' in config and f'code_stub = {{"python": "{CODE_STUB}"}}' in config

    def has_exercises(path):
        return any(has_tag(c, "exercise") for c in nbformat.read(path, as_version=4).cells)

    core = [p for p in SERIES if has_exercises(p)]  # every core notebook, and a deep dive with exercises
    assert all(p in core for p in SERIES if p.name[2] == "_")
    written = sorted(p.relative_to(tmp_path / "source") for p in (tmp_path / "source").rglob("*.ipynb"))
    assert written == [Path(p.stem) / p.name for p in core]
    printed = capsys.readouterr().out
    assert all(f"{p.name}: no exercises, not an assignment" in printed for p in SERIES if p not in core)
    for path in core:
        nb = nbformat.read(tmp_path / "source" / path.stem / path.name, as_version=4)
        answers = [c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        stubs = [c.source for c in nbformat.read(path, as_version=4).cells if has_tag(c, "exercise")]
        assert [without_region(a) for a in answers] == stubs  # signature, docstring and comments all kept
        compile("\n".join(answers), str(path), "exec")
