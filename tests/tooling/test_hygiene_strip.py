"""`tools/hygiene.py --strip`: timing metadata dropped, a print split into chunks joined back, nothing else moved."""

from __future__ import annotations

import json

from tools.hygiene import strip_timing


def out(name, text):
    return {"name": name, "output_type": "stream", "text": text}


def test_strip_joins_split_prints_and_drops_timing(tmp_path):
    image = {"output_type": "display_data", "data": {"image/png": "AAAA"}, "metadata": {}}
    cell = {
        "cell_type": "code",
        "execution_count": 1,
        "metadata": {"execution": {"iopub.status.busy": "2026-11-24T00:00:00Z"}},
        "source": ["print('a'); print('b')"],
        "outputs": [
            out("stdout", ["a\n"]),
            out("stdout", ["b\n", "c"]),
            out("stderr", ["w\n"]),
            image,
            out("stdout", ["d\n"]),
        ],
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    strip_timing(path)
    (stripped,) = json.loads(path.read_text())["cells"]
    assert "execution" not in stripped["metadata"]
    assert stripped["outputs"] == [
        out("stdout", ["a\n", "b\n", "c"]),
        out("stderr", ["w\n"]),
        image,
        out("stdout", ["d\n"]),
    ]
