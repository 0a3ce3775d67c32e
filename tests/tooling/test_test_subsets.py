"""Any subset of the tests runs: shared helpers come from an importable module (tests/testkit.py), never from a
``conftest`` (two conftest.py files share that module name, so ``from conftest import ...`` binds whichever was
imported last)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def test_no_test_module_imports_a_conftest():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name and "conftest" in name]
    assert not offenders, "import shared helpers from testkit, not from a conftest:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "subset",
    [
        ["tests/pretrained", "tests/tooling/test_hosted.py"],  # the subset that once failed to collect
        ["tests/checks/test_checks_nb01.py", "tests/tooling/test_setup.py", "tests/core/test_mha.py"],
    ],
    ids=lambda s: "+".join(Path(p).name for p in s),
)
def test_a_subset_collects_on_its_own(subset):
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *subset],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
