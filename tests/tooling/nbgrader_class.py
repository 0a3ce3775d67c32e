"""One assignment taken through nbgrader as a class would, for tests/tooling/test_nbgrader.py.

The course for notebook 03 (the fastest notebook with exercises) goes through the whole round trip of
docs/teaching.md with three students on one account, told apart by nbgrader's own ``--student`` option:
generate_assignment, release_assignment; each student's fetch_assignment, their work, submit; collect, autograde,
generate_feedback, release_feedback, each student's fetch_feedback; ``nbgrader export`` to grades.csv.

* ``alice`` hands the notebook back without an answer: it must score 0, as the test cells run the checks in strict
  mode; she has also deleted the strict switch from every test cell and switched strict mode off in an answer cell,
  but nbgrader restores the locked test cells, which switch it back on (were they not restored, she would score 3);
* ``bob`` replaces every stub by the worked solution of the companion notebook: full marks;
* ``carol`` does the same, but exercise 1 folds the rows head-major, a classic: every other point, and the
  check's diagnosis in her feedback.

The strict switch is not set in nbgrader's environment: the test cells must set it themselves. The commands run in
two processes (tests/tooling/nbgrader_steps.py), before and after the students' work, and their output is kept.
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat

from tools.nbgrader_course import STRICT, STRICT_PREFIX, write_course
from tools.series import companion
from tools.student import has_tag

ROOT = Path(__file__).resolve().parents[2]
STEPS = Path(__file__).with_name("nbgrader_steps.py")
NOTEBOOK = ROOT / "notebooks" / "03_splitting_heads.ipynb"
ASSIGNMENT = NOTEBOOK.stem
STUDENTS = ("alice", "bob", "carol")  # no answer (and tampering), the worked solutions, one mistake
WRONG_SEQ_FIRST = """def my_transpose_qkv_seq_first(X, num_heads):
    T, B, D = X.shape  # permutes to (H, B, T, d): the rows come out head-major
    return X.reshape(T, B, num_heads, D // num_heads).permute(2, 1, 0, 3).reshape(B * num_heads, T, D // num_heads)
"""
SWITCH_OFF = f'\nimport os\n\nos.environ["{STRICT}"] = "0"\n'


def name_of(cell) -> str:
    return ast.parse(cell.source).body[0].name


def run_nbgrader(home: Path, steps: list[tuple[Path, list[str]]]) -> str:
    """Run ``nbgrader`` commands, each in its folder (tests/tooling/nbgrader_steps.py); their output."""
    env = {k: v for k, v in os.environ.items() if k != STRICT}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # nbgrader runs `alembic`
    env["JUPYTER_CONFIG_DIR"] = str(home / ".jupyter")  # no personal Jupyter or nbgrader configuration
    env["JUPYTER_DATA_DIR"] = str(home / ".local")  # where submit keeps its cache of what was handed in
    env["OMP_NUM_THREADS"] = "1"  # tiny models: one thread each is fastest, as in make test
    plan = home / f"steps-{len(list(home.glob('steps-*')))}.json"
    plan.write_text(json.dumps([[str(folder), args] for folder, args in steps]))
    result = subprocess.run(
        [sys.executable, str(STEPS), str(plan)], env=env, capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    with open(home / "nbgrader-output.txt", "a") as log:  # the whole class's terminal, kept for reading later
        log.write(output)
    assert result.returncode == 0, output[-6000:]
    return output


def answered(released, answers: dict[str, str], tamper: bool = False):
    """The released notebook with the answer cells that define one of ``answers``' functions replaced by it; with
    ``tamper``, the other answer cells switch strict mode off and the test cells lose their strict switch."""
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


def fetched_feedback(student_dir: Path) -> Path:
    """The feedback page a student's fetch_feedback brought home: <assignment>/feedback/<timestamp>/<notebook>.html."""
    (page,) = (student_dir / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
    return page


def take_the_class(home: Path) -> SimpleNamespace:
    """The round trip of the module's docstring in ``home``: the course in ``home/course``, each student's folder in
    ``home/<student>``. Returns the release, the companion, every command's output, grades.csv by student and the
    feedback page each student fetched."""
    root, homes = home / "course", {s: home / s for s in STUDENTS}
    write_course(root, [NOTEBOOK])
    for folder in homes.values():  # each student's folder, with the course's configuration for students
        folder.mkdir()
        config = (root / "students" / "nbgrader_config.py").read_text()
        # On one account, each student keeps their own record of what they submitted, as on an account of their own:
        # fetch_feedback looks there for the submissions whose feedback it may fetch.
        config += f"c.Exchange.cache = {json.dumps(str(folder / 'nbgrader_cache'))}\n"
        (folder / "nbgrader_config.py").write_text(config)
    fetch = [(homes[s], ["fetch_assignment", ASSIGNMENT, "--student", s]) for s in STUDENTS]
    handout = run_nbgrader(
        home,
        [(root, ["generate_assignment", ASSIGNMENT]), (root, ["release_assignment", ASSIGNMENT]), *fetch],
    )
    released = nbformat.read(root / "release" / ASSIGNMENT / NOTEBOOK.name, as_version=4)
    solved = nbformat.read(companion(NOTEBOOK), as_version=4)
    solutions = {name_of(c): c.source for c in solved.cells if has_tag(c, "solution")}
    work = {
        "alice": {},
        "bob": solutions,
        "carol": {**solutions, "my_transpose_qkv_seq_first": WRONG_SEQ_FIRST},
    }
    for student, answers in work.items():
        path = homes[student] / ASSIGNMENT / NOTEBOOK.name
        fetched = nbformat.read(path, as_version=4)
        assert fetched == released, f"{student} fetched something else than the release"
        nbformat.write(answered(fetched, answers, tamper=student == "alice"), path)
    grading = run_nbgrader(
        home,
        [
            *[(homes[s], ["submit", ASSIGNMENT, "--student", s]) for s in STUDENTS],
            # Three students on one account: their files are the teacher's, which collect would call cheating.
            (root, ["collect", ASSIGNMENT, "--ExchangeCollect.check_owner=False"]),
            (root, ["autograde", ASSIGNMENT]),
            (root, ["generate_feedback", ASSIGNMENT]),
            (root, ["release_feedback", ASSIGNMENT]),
            *[(homes[s], ["fetch_feedback", ASSIGNMENT, "--student", s]) for s in STUDENTS],
            (root, ["export"]),
        ],
    )
    with open(root / "grades.csv", newline="") as f:
        grades = {row["student_id"]: row for row in csv.DictReader(f)}
    return SimpleNamespace(
        root=root,
        released=released,
        full=nbformat.read(NOTEBOOK, as_version=4),
        solved=solved,
        output=handout + grading,
        grades=grades,
        feedback={s: fetched_feedback(homes[s]) for s in STUDENTS},
        profile=home / "chromium",
    )
