"""Write the student edition: each notebook without its Solutions section, outputs cleared (``make student``).

    python tools/student.py --out build/student notebooks/*.ipynb

Every exercise already reads task -> hint -> a cell holding a stub that raises NotImplementedError -> the
check. The worked solutions sit after a ``## Solutions`` heading at the end of the notebook, in cells tagged
``solution``; the student edition stops before that heading. Outputs are cleared too, since those of the full
edition would show what the solutions print.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

SOLUTIONS = re.compile(r"## Solutions\s*(\n|$)")


def has_tag(cell, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def _is_solution(cell) -> bool:
    return has_tag(cell, "solution")


def solutions_start(nb) -> int:
    """Index of the ``## Solutions`` heading; every cell tagged ``solution`` must come after it.

    A notebook without exercises (an optional deep dive) has neither: its "start" is its end.
    """
    starts = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and SOLUTIONS.match(c.source)]
    if not starts and not any(_is_solution(c) for c in nb.cells):
        return len(nb.cells)
    if len(starts) != 1:
        raise ValueError(f"expected one '## Solutions' heading, found {len(starts)}")
    early = [i for i, c in enumerate(nb.cells[: starts[0]]) if _is_solution(c)]
    if early:
        raise ValueError(f"cells {early} are tagged 'solution' but come before the '## Solutions' heading")
    return starts[0]


def student_edition(nb):
    """A copy of the notebook without its Solutions section; returns (notebook, number of solutions dropped)."""
    nb = copy.deepcopy(nb)
    start = solutions_start(nb)
    dropped = sum(_is_solution(c) for c in nb.cells[start:])
    nb.cells = nb.cells[:start]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb, dropped


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
        print(f"{path.name}: {count} solution{'s' if count != 1 else ''} left out -> {args.out / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
