"""Shared by the tooling tests: a fresh venv holding the package as a plain install from its built wheel."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
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
