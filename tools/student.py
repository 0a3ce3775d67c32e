"""Write the student edition: every exercise solution replaced by a stub, every check kept (``make student``).

    python tools/student.py --out build/student notebooks/*.ipynb

A solution lives in a code cell tagged ``solution``, between the lines
``# BEGIN SOLUTION`` and ``# END SOLUTION``. In the student edition that block
becomes the same functions and classes with their signatures and docstrings,
each body replaced by ``raise NotImplementedError(hint)`` (the hint comes from a
``# HINT: ...`` line in the block, when there is one), followed by a line that
raises, so that running the cell reminds the learner the exercise is theirs. The
cell is tagged ``raises-exception`` (nbclient and nbval then expect the error)
and shown expanded. The check cells are unchanged: on a stub they print "not
attempted yet" instead of failing.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import textwrap
from pathlib import Path

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
HINT = re.compile(r"#\s*HINT:\s*(.+)")


def _stub_def(node: ast.FunctionDef | ast.ClassDef, hint: str, indent: str = "") -> list[str]:
    """The signature (and docstring) of a function or class, its body replaced by a stub."""
    lines = []
    for deco in node.decorator_list:
        lines.append(f"{indent}@{ast.unparse(deco)}")
    doc = ast.get_docstring(node, clean=False)
    body_indent = indent + "    "
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
        lines.append(f"{indent}class {node.name}{f'({bases})' if bases else ''}:")
        if doc:
            lines.append(textwrap.indent(f'"""{doc}"""', body_indent))
        methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for method in methods:
            lines += _stub_def(method, hint, body_indent)
        if not methods and not doc:
            lines.append(f"{body_indent}pass")
        return lines
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    lines.append(f"{indent}{prefix} {node.name}({ast.unparse(node.args)}){returns}:")
    if doc:
        lines.append(textwrap.indent(f'"""{doc}"""', body_indent))
    lines.append(f"{body_indent}raise NotImplementedError({hint!r})")
    return lines


def stub_source(source: str, exercise: str) -> str:
    """Replace the solution block of a cell's source by stubs; the rest of the cell stays."""
    if BEGIN not in source or END not in source:
        raise ValueError(f"{exercise}: a cell tagged 'solution' needs '{BEGIN}' and '{END}' lines")
    before, rest = source.split(BEGIN, 1)
    block, after = rest.split(END, 1)
    match = HINT.search(block)
    hint = f"{exercise}: {match.group(1).strip()}" if match else f"{exercise}: your code here"
    tree = ast.parse(textwrap.dedent(block))
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    if not defs:
        raise ValueError(f"{exercise}: the solution must define a function or class for the check to call")
    stub = [f"# {exercise}: replace each NotImplementedError with your code, then run the check below."]
    for node in defs:
        stub += _stub_def(node, hint) + [""]
    stub.append(f"raise NotImplementedError({(exercise + ' is yours: fill in the stubs above.')!r})")
    return before + "\n".join(stub) + "\n" + after.lstrip("\n")


def student_edition(nb):
    """A copy of the notebook with every solution cell stubbed; returns (notebook, number of stubs)."""
    nb = copy.deepcopy(nb)
    count = 0
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type != "code" or "solution" not in tags:
            continue
        count += 1
        cell.source = stub_source(cell.source, f"Exercise {count}")
        cell.metadata["tags"] = [t for t in tags if t != "solution"] + ["stub", "raises-exception"]
        cell.metadata.get("jupyter", {}).pop("source_hidden", None)
        cell.outputs, cell.execution_count = [], None
    for cell in nb.cells:  # outputs of the full edition would give the solutions away
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb, count


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
        print(f"{path.name}: {count} exercise{'s' if count != 1 else ''} stubbed -> {args.out / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
