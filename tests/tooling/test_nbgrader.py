"""The nbgrader course (make nbgrader): its transformation, and one assignment taken through nbgrader as a class would.

One fixture takes notebook 03 through the whole round trip of docs/teaching.md with three students on one account
(tests/tooling/nbgrader_class.py says who does what): release, fetch, submit, collect, autograde, feedback fetched
by the students, ``nbgrader export``. The tests read the scores from the exported grades.csv, the feedback from the
students' copies, and every command's output, where no SQLAlchemy warning may reach the teacher. The feedback
pages must typeset their formulas in headless Chromium (tests/tooling/sitekit.py) and request nothing from the network.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import nbformat
import pytest

from tests.tooling.nbgrader_class import ASSIGNMENT, NOTEBOOK, STUDENTS, name_of, take_the_class
from tests.tooling.sitekit import RAW_TEX, chromium, requested_urls
from tools.nbgrader_course import (
    BEGIN,
    CODE_STUB,
    COURSE_ID,
    END,
    STRICT_PREFIX,
    assignment,
    main,
    pair_exercises,
    write_course,
)
from tools.student import has_tag

ROOT = Path(__file__).resolve().parents[2]
SERIES = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # core notebooks and deep dives
MISTAKE = "folded head-major (row h*B + b)"  # what the check says of carol's exercise 1
EXERCISES = sum(has_tag(c, "exercise") for c in nbformat.read(NOTEBOOK, as_version=4).cells)  # one point each
SQLALCHEMY_WARNINGS = re.compile(r"SAWarning|SADeprecationWarning|RemovedIn20Warning|MovedIn20Warning")
# Resolves when MathJax has typeset the page: the number of formulas typeset, and the prose left with TeX in it.
TYPESET_JS = """
const done = arguments[arguments.length - 1];
if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return done({error: 'MathJax did not start'});
MathJax.startup.promise.then(() => {
  const prose = Array.from(document.querySelectorAll('.text_cell_render')).map(cell => {
    const copy = cell.cloneNode(true);
    copy.querySelectorAll('pre, code, mjx-container').forEach(e => e.remove());
    return copy.textContent;
  });
  done({typeset: document.querySelectorAll('.text_cell_render mjx-container').length, prose: prose});
}, e => done({error: String(e)}));
"""


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return take_the_class(tmp_path_factory.mktemp("class"))


def score(course, student) -> tuple[float, float]:
    return float(course.grades[student]["score"]), float(course.grades[student]["max_score"])


def test_each_student_is_filed_under_the_id_given_to_nbgrader(course):
    assert sorted(course.grades) == sorted(STUDENTS)
    assert all(f"Collecting submission: {s} {ASSIGNMENT}" in course.output for s in STUDENTS)
    assert sorted(p.name for p in (course.root / "submitted").iterdir()) == sorted(STUDENTS)


def test_a_notebook_without_answers_scores_zero_even_with_the_strict_switch_taken_out(course):
    assert EXERCISES >= 3 and score(course, "alice") == (0, EXERCISES)
    assert "not attempted (Exercise 1: not written yet)" in course.feedback["alice"].read_text()


def test_the_worked_solutions_score_full_marks(course):
    assert score(course, "bob") == (EXERCISES, EXERCISES)


def test_one_mistake_costs_its_point_and_the_feedback_names_it(course):
    assert score(course, "carol") == (EXERCISES - 1, EXERCISES)
    feedback = course.feedback["carol"].read_text()
    assert MISTAKE in feedback and "my_transpose_qkv_seq_first" in feedback
    assert MISTAKE not in course.feedback["bob"].read_text()


def test_no_sqlalchemy_warning_reaches_the_teacher(course):
    assert "$ cd" in course.output and "nbgrader export" in course.output  # the output of every step is there
    warnings = [line for line in course.output.splitlines() if SQLALCHEMY_WARNINGS.search(line)]
    assert warnings == []


def test_the_feedback_loads_nothing_from_the_network(course):
    page = course.feedback["carol"].read_text()
    loads = re.findall(r"<(?:script|link|img)\b[^>]*?(?:src|href)=\"([^\"]+)\"", page)
    assert loads and not [url for url in loads if re.match(r"(https?:)?//", url)]
    assert "cdnjs" not in page and "data:text/javascript;base64," in page


def test_the_feedback_typesets_its_formulas_offline(course):
    browser = chromium(course.profile)
    try:
        browser.get(course.feedback["carol"].as_uri())  # the student's copy, opened as a file
        result = browser.execute_async_script(TYPESET_JS)
        requests, log = requested_urls(browser), browser.get_log("browser")
    finally:
        browser.quit()
    assert "error" not in result, result
    assert result["typeset"] >= 20, result["typeset"]  # notebook 03's prose has about a hundred formulas
    raw = [m.group() for text in result["prose"] for m in RAW_TEX.finditer(text)]
    assert raw == [], raw[:5]
    network = [url for url in requests if urllib.parse.urlsplit(url).scheme in {"http", "https", "ws", "wss", "ftp"}]
    assert network == [] and [e for e in log if e["level"] == "SEVERE"] == [], (network, log)


def test_the_released_notebook_keeps_the_stubs_and_holds_no_solution(course):
    stubs = [c for c in course.full.cells if has_tag(c, "exercise")]
    answers = [c for c in course.released.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(answers) == len(stubs) == EXERCISES
    for stub, answer in zip(stubs, answers, strict=True):
        lines = answer.source.split("\n")
        assert [line.strip() for line in lines].count(CODE_STUB) == 1
        assert [line for line in lines if line.strip() != CODE_STUB] == stub.source.split("\n")
    released = "\n".join(c.source for c in course.released.cells)
    assert "BEGIN SOLUTION" not in released and "## Solutions" not in released
    for solution in (c for c in course.solved.cells if has_tag(c, "solution")):
        body = [line.strip() for line in solution.source.split("\n")[1:] if line.strip()]
        assert not [line for line in body if line in released], name_of(solution)
    assert sum(has_tag(c, "hint") for c in course.released.cells) == EXERCISES
    assert all(not c.get("outputs") for c in course.released.cells)


def test_the_released_test_cells_are_locked_and_strict(course):
    tests = [c for c in course.released.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(tests) == EXERCISES
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
    exchange = f"c.Exchange.root = {json.dumps(str(tmp_path / 'exchange'))}"
    assert exchange in config and exchange in (tmp_path / "students" / "nbgrader_config.py").read_text()
    assert (tmp_path / "exchange").stat().st_mode & 0o777 == 0o777  # every student hands work in there

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


def test_the_exchange_may_be_any_folder(tmp_path):
    exchange = tmp_path / "shared" / "exchange"
    write_course(tmp_path / "course", [], exchange)
    for config in (tmp_path / "course" / "nbgrader_config.py", tmp_path / "course" / "students" / "nbgrader_config.py"):
        assert f"c.Exchange.root = {json.dumps(str(exchange))}" in config.read_text()
    assert exchange.is_dir() and not (tmp_path / "course" / "exchange").exists()
