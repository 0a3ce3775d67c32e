"""Write an nbgrader course from the series (``make nbgrader``): one assignment per notebook with exercises.

    python tools/nbgrader_course.py --out build/nbgrader [--exchange DIR] notebooks/*.ipynb

writes into the course folder ``--out``:

* ``nbgrader_config.py``, the teacher's configuration: the course id, the exchange (``--exchange``, by default
  ``exchange/`` in the course folder, created world-writable as nbgrader itself would), and feedback pages that
  typeset their formulas offline;
* ``students/nbgrader_config.py``, the students' configuration: the course id and the same exchange, for
  ``nbgrader fetch_assignment``, ``submit`` and ``fetch_feedback``;
* ``templates/feedback/mathjax.html.j2``: nbgrader's feedback template calls nbconvert's ``mathjax()`` macro, which
  loads MathJax 2 from a CDN whatever ``HTMLExporter.mathjax_url`` says; this macro of the same name, found first,
  carries MathJax 3 (``tex-svg-full.js`` of the sphinx-mathjax-offline package: SVG output, so no font files) in the
  page as a data: URL. A feedback page is a single file (release_feedback hands out nothing else), so it must carry
  its MathJax to show formulas offline wherever a student opens it;
* ``source/<stem>/<stem>.ipynb`` for every notebook that has exercises (a notebook without any is skipped).

Each source notebook is the student edition of ``tools/student.py`` (the lesson, outputs cleared) with two changes,
the worked solutions coming from the lesson's companion notebook ``notebooks/solutions/NN_solutions.ipynb``
(tools/series.py ``companion``):

* each learner's stub becomes an nbgrader answer cell: the stub as it is, with the body of the matching worked
  solution inserted between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` right after the signature and
  docstring. ``nbgrader generate_assignment`` replaces that region with ``# YOUR CODE HERE`` (the course's
  ``ClearSolutions.code_stub``), so students get back the stub they would have had in the student edition,
  ``raise NotImplementedError("Exercise N: not written yet")`` included; in the source notebook that line comes
  after the solution's ``return`` and is never reached.
* the check after each stub becomes a locked test cell worth ``POINTS`` that first switches the checks to strict
  mode, so an exercise not attempted fails its check instead of printing "not attempted yet". nbgrader restores
  locked cells from the source when it autogrades, so students cannot take the switch out.

A solution belongs to the exercise whose stub defines a function of the same name, and both must be followed by
the same check; anything else (a name defined twice, a solution without an exercise, different signatures) is
refused with a ValueError rather than guessed, and so is a lesson that holds a solution cell itself.
"""

from __future__ import annotations

import argparse
import ast
import base64
import io
import json
import os
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

try:
    from tools.series import companion
    from tools.student import has_tag, student_edition
except ModuleNotFoundError:  # run as a script, with tools/ itself on sys.path
    from series import companion
    from student import has_tag, student_edition

COURSE_ID = "mha-tutorial"
POINTS = 1  # per exercise: every check is pass or fail, and no exercise is worth several others
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = "# YOUR CODE HERE"  # what generate_assignment puts in place of a solution region
STRICT = "MHA_TUTORIAL_STRICT_CHECKS"
STRICT_PREFIX = f'import os\n\nos.environ["{STRICT}"] = "1"  # graded: an exercise not attempted fails its check\n'

CONFIG = '''"""nbgrader configuration of the course written by tools/nbgrader_course.py (make nbgrader)."""

from pathlib import Path

import nbgrader

c = get_config()  # noqa: F821 -- nbgrader defines get_config() when it loads this file

c.CourseDirectory.course_id = "{course_id}"
# The exchange: release_assignment puts the assignments there, the students' fetch_assignment takes them and their
# submit hands their work in there, collect takes it back. Every student must be able to write to it; the students'
# configuration (students/nbgrader_config.py) names the same folder.
c.Exchange.root = {exchange}
# Every answer cell keeps its stub's own `raise NotImplementedError("Exercise N: not written yet")` after the
# solution region, so the region is replaced by a comment only.
c.ClearSolutions.code_stub = {{"python": "{code_stub}"}}
# Seconds per cell when autograding (nbgrader's default is 30): room to spare on a busy grading machine.
c.Execute.timeout = 300
# Feedback pages that typeset their formulas offline: templates/feedback/mathjax.html.j2 beside this file is found
# before nbconvert's macro of the same name (which loads MathJax from a CDN); nbgrader's own feedback template after it.
c.HTMLExporter.extra_template_basedirs = [
    str(Path(__file__).resolve().parent / "templates"),
    str(Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates"),
]
'''

STUDENT_CONFIG = '''"""nbgrader configuration for the students of the course (tools/nbgrader_course.py): put it in the folder where
you run nbgrader fetch_assignment, submit and fetch_feedback, or in ~/.jupyter/."""

c = get_config()  # noqa: F821 -- nbgrader defines get_config() when it loads this file

c.CourseDirectory.course_id = "{course_id}"
c.Exchange.root = {exchange}
'''

MATHJAX_FILE = "sphinx-mathjax-offline/static/mathjax/tex-svg-full.js"  # MathJax 3, Apache-2.0
# MathJax 3 reads its configuration from window.MathJax when it starts: $...$ (as the notebooks write) and \(...\).
MATHJAX_MACRO = """{{#- Written by tools/nbgrader_course.py. Found before nbconvert's macro of the same name, which loads MathJax
    from a CDN: MathJax 3 ({source}, Apache-2.0) is carried in the page itself, so it typesets offline. -#}}
{{%- macro mathjax(url=None) -%}}
<script>
window.MathJax = {{tex: {{inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], processEscapes: true}}}};
</script>
<script src="data:text/javascript;base64,{code}"></script>
{{%- endmacro %}}
"""


@dataclass
class Function:
    """The one top-level function of a stub or solution cell, split into header and body."""

    name: str
    signature: str  # ast.dump of the arguments, to compare a stub with its solution
    lines: list[str]  # the cell's source lines
    header_end: int  # lines[:header_end] run up to the end of the signature, or of the docstring if any
    end: int  # lines[header_end:end] are the body
    indent: str  # of the first statement of the body
    statements: list[ast.stmt]  # of the body, docstring left out


def _signature_end(lines: list[str], func: ast.FunctionDef) -> int:
    """Number of the line (1-based) holding the colon that ends the ``def``, however many lines it spans."""
    depth = 0
    tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines[func.lineno - 1 :])).readline)
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.OP and tok.string == ":" and depth == 0:
            return func.lineno + tok.start[0] - 1
    raise ValueError(f"no end found to the signature of {func.name}")  # unreachable for code that parses


def parse_function(source: str, what: str) -> Function:
    """The cell's one top-level function; ``what`` names the cell in errors."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{what} is not valid Python: {e}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise ValueError(f"{what} must hold one function definition and nothing else")
    func = tree.body[0]
    lines = source.split("\n")
    has_doc = ast.get_docstring(func, clean=False) is not None
    header_end = func.body[0].end_lineno if has_doc else _signature_end(lines, func)
    statements = func.body[1:] if has_doc else func.body
    if not statements or statements[0].lineno <= header_end:
        raise ValueError(f"{what}: the body of {func.name} must start on a line of its own after the signature")
    indent = lines[statements[0].lineno - 1][: statements[0].col_offset]
    return Function(func.name, ast.dump(func.args), lines, header_end, func.end_lineno, indent, statements)


def _raises_not_implemented(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Raise) or statement.exc is None:
        return False
    exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def answer_source(stub: Function, solution: Function) -> str:
    """The stub with the solution's body inserted, between the markers, right after its signature and docstring."""
    if stub.signature != solution.signature:
        raise ValueError(f"the stub and the solution of {stub.name} have different signatures")
    if not any(_raises_not_implemented(s) for s in stub.statements):
        raise ValueError(f"the stub of {stub.name} must raise NotImplementedError, so that an untouched one fails")
    if not isinstance(solution.statements[-1], ast.Return | ast.Raise):
        raise ValueError(f"the solution of {stub.name} must end with a return: the stub's body follows it")
    body = "\n".join(solution.lines[solution.header_end : solution.end])
    if solution.indent != stub.indent:
        body = textwrap.indent(textwrap.dedent(body), stub.indent)
    region = [stub.indent + BEGIN, body, stub.indent + END]
    source = "\n".join(stub.lines[: stub.header_end] + region + stub.lines[stub.header_end :])
    parse_function(source, f"the answer cell of {stub.name}")  # still one function that parses
    return source


def pair_exercises(nb, solved) -> list[tuple[int, int]]:
    """(stub cell of the lesson ``nb``, solution cell of its companion ``solved``) index pairs in exercise order,
    matched by the name of the function they define."""
    stubs = _by_name(nb, [i for i, c in enumerate(nb.cells) if has_tag(c, "exercise")], "exercise")
    early = [i for i, c in enumerate(nb.cells) if has_tag(c, "solution")]
    if early:
        raise ValueError(f"cells {early} of the lesson are tagged 'solution': solutions belong in its companion")
    solutions = _by_name(solved, [i for i, c in enumerate(solved.cells) if has_tag(c, "solution")], "solution")
    if stubs.keys() != solutions.keys():
        missing, extra = sorted(stubs.keys() - solutions.keys()), sorted(solutions.keys() - stubs.keys())
        raise ValueError(f"exercises without a solution: {missing}; solutions without an exercise: {extra}")
    pairs = [(i, solutions[name]) for name, i in stubs.items()]
    for i, j in pairs:
        if _check_after(nb, i) != _check_after(solved, j):
            raise ValueError(f"cells {i} and {j} (exercise and solution) are not followed by the same check")
    return pairs


def _by_name(nb, indices: list[int], tag: str) -> dict[str, int]:
    """Cell index by the name of the function each cell defines; a name defined twice is ambiguous."""
    found: dict[str, int] = {}
    for i in indices:
        name = parse_function(nb.cells[i].source, f"cell {i} (tagged '{tag}')").name
        if name in found:
            raise ValueError(f"cells {found[name]} and {i} are both tagged '{tag}' and define {name}: ambiguous")
        found[name] = i
    return found


def _check_after(nb, i: int) -> str:
    if i + 1 >= len(nb.cells) or nb.cells[i + 1].cell_type != "code":
        raise ValueError(f"cell {i} is not followed by a code cell with its check")
    return nb.cells[i + 1].source


def nbgrader_metadata(grade_id: str, answer: bool) -> dict:
    """An autograded answer (the learner's code) or an autograder test worth POINTS (its check), schema 3."""
    meta = {"grade": not answer, "grade_id": grade_id, "locked": not answer, "schema_version": 3}
    meta |= {"solution": answer, "task": False}
    return meta if answer else meta | {"points": POINTS}


def assignment(nb, solved):
    """The nbgrader source notebook of one lesson ``nb`` and its companion ``solved``: (notebook, number of
    exercises). A lesson without exercises needs no companion (``solved`` may be None)."""
    if solved is None:
        if any(has_tag(c, "exercise") for c in nb.cells):
            raise ValueError("a lesson with exercises needs its companion notebook of worked solutions")
        solved = type(nb)(cells=[])
    pairs = pair_exercises(nb, solved)
    source, _ = student_edition(nb)  # the lesson, outputs cleared
    for number, (i, j) in enumerate(pairs, start=1):
        stub = parse_function(nb.cells[i].source, f"cell {i}")
        answer, check = source.cells[i], source.cells[i + 1]
        answer.source = answer_source(stub, parse_function(solved.cells[j].source, f"solution cell {j}"))
        answer.metadata["nbgrader"] = nbgrader_metadata(f"ex{number}_{stub.name}", answer=True)
        check.source = STRICT_PREFIX + check.source
        check.metadata["nbgrader"] = nbgrader_metadata(f"ex{number}_{stub.name}_check", answer=False)
    return source, len(pairs)


def mathjax_macro() -> str:
    """templates/feedback/mathjax.html.j2: the macro that carries MathJax 3 in every feedback page."""
    try:
        source = Path(metadata.distribution("sphinx-mathjax-offline").locate_file(MATHJAX_FILE))
    except metadata.PackageNotFoundError:
        raise SystemExit(
            "the feedback pages' MathJax comes from the package sphinx-mathjax-offline: install it (make install-grading)"
        ) from None
    code = base64.b64encode(source.read_bytes()).decode("ascii")
    return MATHJAX_MACRO.format(source=f"{MATHJAX_FILE.split('/')[-1]} of sphinx-mathjax-offline", code=code)


def make_exchange(exchange: Path) -> None:
    """The exchange folder, writable by every student, as nbgrader's release_assignment would create it."""
    if exchange.is_dir():
        return
    try:
        exchange.mkdir(parents=True)
        exchange.chmod(0o777)
    except PermissionError:
        raise SystemExit(
            f"cannot create the exchange {exchange}: ask an administrator to create it writable by every student "
            f"(mkdir -p {exchange} && chmod 777 {exchange}), then run this again"
        ) from None


def write_config(out: Path, exchange: Path) -> None:
    """The teacher's and the students' nbgrader_config.py, the feedback pages' MathJax, and the exchange."""
    make_exchange(exchange)
    names = {"course_id": COURSE_ID, "exchange": json.dumps(str(exchange))}
    (out / "nbgrader_config.py").write_text(CONFIG.format(code_stub=CODE_STUB, **names))
    (out / "students").mkdir(exist_ok=True)
    (out / "students" / "nbgrader_config.py").write_text(STUDENT_CONFIG.format(**names))
    (out / "templates" / "feedback").mkdir(parents=True, exist_ok=True)
    (out / "templates" / "feedback" / "mathjax.html.j2").write_text(mathjax_macro())


def write_course(out: Path, paths: list[Path], exchange: Path | None = None) -> list[Path]:
    """Write the course configuration and one source assignment per notebook with exercises; returns those.
    The exchange is ``exchange/`` in the course folder unless given."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    write_config(out, Path(os.path.abspath(exchange or out / "exchange")))
    written = []
    for path in paths:
        solutions = companion(path)
        solved = nbformat.read(solutions, as_version=4) if solutions.exists() else None
        nb, count = assignment(nbformat.read(path, as_version=4), solved)
        if not count:
            print(f"{path.name}: no exercises, not an assignment")
            continue
        target = out / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written.append(target)
        points = count * POINTS
        print(f"{path.name}: {count} exercise{'s' * (count != 1)}, {points} point{'s' * (points != 1)} -> {target}")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("build/nbgrader"))
    parser.add_argument("--exchange", type=Path, help="the exchange folder (default: exchange/ in the course folder)")
    args = parser.parse_args(argv)
    write_course(args.out, args.notebooks, args.exchange)
    return 0


if __name__ == "__main__":
    sys.exit(main())
