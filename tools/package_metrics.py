"""Size metrics of the mha_tutorial package at a git revision (for issue notes: before/after).

    python tools/package_metrics.py [REV]     # default: the working tree

Prints lines per module, the longest class and function, and the guard-line share of the
formula modules: lines of a ``raise`` statement, or of an ``if`` whose body only raises,
over the module's non-blank, non-comment code lines outside docstrings.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FORMULA_MODULES = ("core/attention.py", "core/heads.py", "core/mha.py")


def sources(rev: str | None) -> dict[str, str]:
    if rev is None:
        return {str(p): p.read_text() for p in sorted(Path("mha_tutorial").rglob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "mha_tutorial"], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        n: subprocess.run(["git", "show", f"{rev}:{n}"], capture_output=True, text=True, check=True).stdout
        for n in names
        if n.endswith(".py")
    }


def _only_raises(node: ast.If) -> bool:
    return all(isinstance(s, ast.Raise) for s in node.body) and not node.orelse


def guard_share(text: str) -> float:
    tree = ast.parse(text)
    guard, doc = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) or (isinstance(node, ast.If) and _only_raises(node)):
            guard.update(range(node.lineno, node.end_lineno + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = text.splitlines()
    code = {i for i, line in enumerate(lines, 1) if line.strip() and not line.strip().startswith("#")} - doc
    return len(guard & code) / max(1, len(code))


def longest(text: str, kind) -> tuple[int, str]:
    spans = [(n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(ast.parse(text)) if isinstance(n, kind)]
    return max(spans, default=(0, "-"))


def main(rev: str | None = None) -> None:
    files = sources(rev)
    print(f"revision: {rev or 'working tree'}")
    print(f"{'module':45} {'lines':>6}  longest class               longest function")
    for name, text in files.items():
        c, f = longest(text, ast.ClassDef), longest(text, (ast.FunctionDef, ast.AsyncFunctionDef))
        print(f"{name:45} {len(text.splitlines()):6}  {c[1][:20]:20} {c[0]:4}   {f[1][:24]:24} {f[0]:4}")
    total = sum(len(t.splitlines()) for t in files.values())
    print(f"{'total':45} {total:6}")
    for name in FORMULA_MODULES:
        text = files.get(f"mha_tutorial/{name}")
        if text is not None:
            print(f"guard-line share {name}: {guard_share(text):.0%}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
