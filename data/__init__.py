"""The data the package ships: evaluation splits, trained checkpoints, paraphrase pairs and the shipped studies.

In the repository this is the top-level ``data/`` folder (README.md beside this file says how each file was made);
installed, it is the package data ``mha_tutorial.data`` (pyproject.toml maps the one onto the other). Code finds a
file as ``DATA_DIR / name``, wherever the package was installed from.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
