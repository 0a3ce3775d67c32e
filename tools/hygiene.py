"""Notebook hygiene: what strict nbval and readers on GitHub would trip on (pre-commit hook and a test).

    python tools/hygiene.py notebooks/*.ipynb           # prints problems, exits 1 if any
    python tools/hygiene.py --strip notebooks/*.ipynb   # first strips timing metadata (nbstripout), joins prints

Checks: every code cell executed, execution counts 1, 2, 3, ... (a clean top-to-bottom run), no
error outputs outside cells tagged ``raises-exception``, no warnings on stderr, no absolute paths
or memory addresses in outputs, no per-cell timing metadata (it turns every re-run into a diff of
timestamps), and a file size that GitHub renders comfortably.

Stripping is nbstripout's (``--keep-output --keep-count --keep-id --extra-keys cell.metadata.execution``: the
outputs, counts and cell ids stay, nbclient's per-cell timestamps go). What no tool does is here: the checks above,
and joining the consecutive chunks of one stream, whose number depends on timing and would fail strict nbval.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:home|Users|root|tmp|work|opt|var|usr)/[^\s'\"]+")
ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,16}\b")
MAX_BYTES = 2_000_000


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    elif output.get("output_type") == "error":
        text = "\n".join(output.get("traceback", []))
    else:
        text = output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def problems(path: Path) -> list[str]:
    found = []
    if path.stat().st_size > MAX_BYTES:
        found.append(f"{path.stat().st_size / 1e6:.1f} MB: shrink the figures (dpi, size, count)")
    nb = json.loads(path.read_text())
    counts = []
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell.get("source", ""))
        if cell["cell_type"] != "code" or not source.strip():
            continue
        counts.append(cell.get("execution_count"))
        if "execution" in cell.get("metadata", {}):
            found.append(f"cell {i}: per-cell timing metadata: drop it with tools/hygiene.py --strip")
        tags = set(cell.get("metadata", {}).get("tags", []))
        for output in cell.get("outputs", []):
            text = _text(output)
            if output.get("output_type") == "error" and "raises-exception" not in tags:
                found.append(f"cell {i}: {output.get('ename')} in a cell not tagged raises-exception")
            if output.get("name") == "stderr" and "Warning" in text:
                found.append(f"cell {i}: a warning on stderr")
            if ABSOLUTE_PATH.search(text):
                found.append(f"cell {i}: absolute path in the output: {ABSOLUTE_PATH.search(text).group(0)[:60]}")
            if ADDRESS.search(text) and "NBVAL_IGNORE_OUTPUT" not in source:
                found.append(f"cell {i}: memory address in the output")
    if counts != list(range(1, len(counts) + 1)):
        found.append("execution counts are not 1, 2, 3, ...: re-run top to bottom in a fresh kernel (make outputs)")
    return found


def _joined_streams(outputs: list[dict]) -> list[dict]:
    """Consecutive stream outputs of one name as one: how many chunks a print arrives in depends on timing."""
    joined: list[dict] = []
    for output in outputs:
        last = joined[-1] if joined else {}
        if output.get("output_type") == last.get("output_type") == "stream" and output["name"] == last["name"]:
            last["text"] = (_text(last) + _text(output)).splitlines(keepends=True)
        else:
            joined.append(output)
    return joined


NBSTRIPOUT = [sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count", "--keep-id"]


def strip_timing(path: Path) -> None:
    """Remove nbclient's ``metadata.execution`` timestamps (nbstripout) and join split streams."""
    subprocess.run([*NBSTRIPOUT, "--extra-keys", "cell.metadata.execution", str(path)], check=True)
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if "outputs" in cell:
            cell["outputs"] = _joined_streams(cell["outputs"])
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    strip = "--strip" in args
    paths = [Path(p) for p in args if p != "--strip"] or sorted(Path("notebooks").glob("*.ipynb"))
    if strip:
        for path in paths:
            strip_timing(path)
    bad = 0
    for path in paths:
        for problem in problems(path):
            print(f"{path}: {problem}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
