"""The notebooks of the series, in reading order: shared by the site, the student edition and the tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def series_notebooks(folder: Path = ROOT / "notebooks") -> list[Path]:
    """The core notebooks (NN_name) and the optional deep dives (NNa_name) in ``folder``, in series order.

    Sorting by file name puts each deep dive right after its core notebook (04 before 04a before 05).
    """
    found = [*folder.glob("[0-9][0-9]_*.ipynb"), *folder.glob("[0-9][0-9][a-z]_*.ipynb")]
    return sorted(found, key=lambda p: p.name)


def companion(lesson: Path) -> Path:
    """The companion notebook holding the worked solutions of a lesson: ``solutions/NN_solutions.ipynb`` beside it.

    NN is the lesson's prefix (``03`` for 03_splitting_heads.ipynb, ``01a`` for 01a_softmax_jacobian.ipynb). The
    path is returned whether or not the file exists: a lesson without exercises has no companion.
    """
    return lesson.parent / "solutions" / f"{lesson.name.split('_')[0]}_solutions.ipynb"


def companions(folder: Path = ROOT / "notebooks") -> list[Path]:
    """The companions of the lessons in ``folder`` that have one, in series order."""
    return [c for c in map(companion, series_notebooks(folder)) if c.exists()]
