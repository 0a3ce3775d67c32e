"""Write the student edition: each lesson with its outputs cleared (``make student``).

    python tools/student.py --out build/student notebooks/*.ipynb

Every exercise already reads task -> hint -> a cell holding a stub that raises NotImplementedError -> the
check. The worked solutions live in a companion notebook, ``notebooks/solutions/NN_solutions.ipynb``
(tools/series.py ``companion``), in cells tagged ``solution``; a lesson holds none, so a reader scrolling it (on
GitHub too) never sees one. The student edition is the lesson with its outputs cleared, since those of the
full edition would show what a finished run prints; a lesson that still holds a ``solution`` cell is refused.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path


def has_tag(cell, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def _is_solution(cell) -> bool:
    return has_tag(cell, "solution")


def check_lesson(nb) -> None:
    """A lesson holds no worked solution: those belong in its companion notebook."""
    found = [i for i, c in enumerate(nb.cells) if _is_solution(c)]
    if found:
        raise ValueError(f"cells {found} are tagged 'solution': worked solutions belong in the companion notebook")


# A lesson's link to its companion, `[solutions/NN_solutions.ipynb](solutions/NN_solutions.ipynb)`: the handout has no
# solutions folder, so the link would lead nowhere.
COMPANION_LINK = re.compile(r"\[solutions/([\w.-]+\.ipynb)\]\(solutions/[\w.-]+\.ipynb\)")


def student_edition(nb):
    """A copy of the lesson with its outputs cleared and its link to the companion of solutions named as the answer
    key instead; returns (notebook, number of exercises it holds)."""
    check_lesson(nb)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        else:
            cell.source = COMPANION_LINK.sub(r"`\1` (the answer key, not part of this handout)", cell.source)
    return nb, sum(has_tag(c, "exercise") for c in nb.cells)


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("build/student"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks:
        nb, count = student_edition(nbformat.read(path, as_version=4))
        nbformat.write(nb, args.out / path.name)
        print(f"{path.name}: {count} exercise{'s' if count != 1 else ''}, outputs cleared -> {args.out / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
