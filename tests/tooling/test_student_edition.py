"""The student edition (make student): every solution stubbed, every check kept, and it runs.

Each notebook's student edition is executed top to bottom with nbclient, as a learner without the
repository would run it: in a fresh venv holding the package installed from its wheel, from a folder
outside the checkout (so this also proves that every notebook works from a plain install). A stub cell must
raise NotImplementedError (its ``raises-exception`` tag lets it); every other cell must run
without error, which includes the check cells: on a stub they report "not attempted yet".
"""

import subprocess
from pathlib import Path

import nbformat
import pytest

from tools.student import stub_source, student_edition

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXECUTE = """
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(Path(sys.argv[1]).parent)}}).execute()
nbformat.write(nb, sys.argv[1])
"""


def test_stub_keeps_signatures_and_hint_and_raises():
    source = 'import math\n# BEGIN SOLUTION\n# HINT: use math.sqrt\ndef f(x, d=2):\n    """Doc."""\n    return x / math.sqrt(d)\n# END SOLUTION\nprint("after")\n'
    stub = stub_source(source, "Exercise 9")
    assert "def f(x, d=2):" in stub and '"""Doc."""' in stub and "return x /" not in stub
    assert "raise NotImplementedError('Exercise 9: use math.sqrt')" in stub
    assert stub.startswith("import math\n") and stub.rstrip().endswith('print("after")')
    namespace = {}
    with pytest.raises(NotImplementedError, match="Exercise 9 is yours"):
        exec(stub, namespace)
    with pytest.raises(NotImplementedError, match="use math.sqrt"):
        namespace["f"](1.0)


def test_a_solution_without_markers_or_definitions_is_refused():
    with pytest.raises(ValueError, match="BEGIN SOLUTION"):
        stub_source("x = 1\n", "Exercise 1")
    with pytest.raises(ValueError, match="function or class"):
        stub_source("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "Exercise 1")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_edition_runs_with_only_the_stubs_raising(path, tmp_path, wheel_python):
    full = nbformat.read(path, as_version=4)
    nb, count = student_edition(full)
    solutions = sum("solution" in c.metadata.get("tags", []) for c in full.cells)
    assert count == solutions
    if count == 0:
        pytest.skip(f"{path.name} has no exercises")
    assert not any("BEGIN SOLUTION" in c.source for c in nb.cells)
    # Run it as a learner without the repository would: the package installed from its wheel (not editable),
    # the notebook in a folder of its own.
    python, _ = wheel_python
    copy = tmp_path / path.name
    nbformat.write(nb, copy)
    result = subprocess.run(
        [python, "-c", EXECUTE, str(copy)], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    nb = nbformat.read(copy, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if "stub" in cell.metadata.get("tags", []):
            assert [e.ename for e in errors] == ["NotImplementedError"], cell.source[:200]
        else:
            assert not errors, f"{path.name}: a non-stub cell failed: {errors[0].ename}: {errors[0].evalue}"
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert printed.count("not attempted yet") >= count
