"""Where the prose of notebooks 04-08 (and the deep dives) quotes a decimal number, a cell prints it.

A number in a markdown cell counts as sourced when the same string occurs in a text output of the same notebook,
or when its line cites the literature: "et al.", a year in parentheses such as "(2019)", or a section sign "§".
Numbers inside `code spans` are settings written in code, not measurements, and are not checked.
"""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = sorted(
    p
    for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")
    if int(p.name[:2]) >= 4 or not p.name[2] == "_"  # 04-08, and every deep dive
)
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\d)")
CITATION = re.compile(r"et al\.|\(\d{4}[a-z]?\)|§|\b(19|20)\d{2}\b")
CODE_SPAN = re.compile(r"`[^`]*`")


def printed(nb) -> str:
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts.append(output.get("text", ""))
            data = output.get("data", {})
            texts += [data.get("text/plain", ""), data.get("text/markdown", ""), data.get("text/html", "")]
    return "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)


def unsourced(nb) -> list[str]:
    out = printed(nb)
    missing = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if CITATION.search(line):
                continue
            for number in DECIMAL.findall(CODE_SPAN.sub("", line)):
                if number not in out:
                    missing.append(f"cell {i}: {number} in {line.strip()[:120]!r}")
    return missing


def test_the_rule_recognises_printed_cited_and_unprinted_numbers():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("The loss falls to 0.037; see Michel et al. for 0.92; `lr=0.003` is a setting."),
        nbformat.v4.new_code_cell("print(loss)", outputs=[nbformat.v4.new_output("stream", text="loss 0.037\n")]),
        nbformat.v4.new_markdown_cell("Accuracy reaches 0.995 here.\nVaswani et al. (2017) report 28.4 BLEU."),
    ]
    assert unsourced(nb) == ["cell 2: 0.995 in 'Accuracy reaches 0.995 here.'"]


@pytest.mark.parametrize("path", CHECKED, ids=[p.stem for p in CHECKED])
def test_every_decimal_number_in_the_prose_is_printed_or_cited(path):
    missing = unsourced(nbformat.read(path, as_version=4))
    assert not missing, f"{path.name}: numbers in the prose that no cell prints:\n" + "\n".join(missing)
