"""A plain (non-editable) install from a built wheel carries its data: the committed splits and checkpoints
load, and a notebook that needs them runs, from a directory outside the repository."""

import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory):
    """A fresh venv holding only the wheel of mha_tutorial; its other dependencies come from this environment's
    site-packages through a plain path entry (which, unlike a site directory, does not run the editable
    install's .pth hook, so the checkout itself cannot be imported by accident)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a clean copy: setuptools reuses a build/ folder, whose stale files could hide a missing one.
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp, source],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp.glob("mha_tutorial-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
        check=True,
        capture_output=True,
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


def test_wheel_loads_every_checkpoint_and_split_from_elsewhere(wheel_python, tmp_path):
    python, site = wheel_python
    script = textwrap.dedent(
        """
        import mha_tutorial
        from mha_tutorial import load_pretrained, load_split
        print(mha_tutorial.__file__)
        for name in ("reversal", "induction", "dates"):
            model = load_pretrained(name, device="cpu")
            print(name, sum(p.numel() for p in model.parameters()), len(load_split(name, "eval")),
                  len(load_split(name, "importance")))
        """
    )
    out = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(str(site)), f"imported {lines[0]}, not the installed wheel"
    assert lines[1:] == ["reversal 37466 1000 1000", "induction 37265 1000 1000", "dates 125644 1000 1000"]


def test_wheel_runs_notebook_06_from_another_directory(wheel_python, tmp_path):
    # Notebook 06 loads all three checkpoints and both kinds of split, and its exercise checks load them again.
    python, _ = wheel_python
    notebook = tmp_path / "06.ipynb"
    notebook.write_bytes((ROOT / "notebooks" / "06_visualizing_attention_heads.ipynb").read_bytes())
    script = textwrap.dedent(
        f"""
        import nbformat
        from nbclient import NotebookClient
        nb = nbformat.read({str(notebook)!r}, as_version=4)
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={{"metadata": {{"path": {str(tmp_path)!r}}}}}).execute()
        print("executed", sum(c.cell_type == "code" for c in nb.cells), "code cells")
        """
    )
    out = subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("executed")
