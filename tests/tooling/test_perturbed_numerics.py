"""`make nbval` checks the committed outputs on other numeric code paths than `make outputs` wrote them with
(the Makefile's NUMERICS): here we prove those settings really change the path and the float32 rounding, so that
a green nbval means the outputs reproduce where the rounding differs (another CPU, another BLAS path, other threads).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import torch
g = torch.Generator().manual_seed(0)
a, b = torch.randn(8, 128, 384, generator=g), torch.randn(384, 384, generator=g)
x = torch.randn(64, 384, generator=g)
print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
print(repr((a @ b).sum().item()), repr(torch.nn.functional.layer_norm(x, (384,)).sum().item()))
"""


def numerics() -> dict[str, str]:
    line = re.search(r"^NUMERICS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert line, "the Makefile defines NUMERICS, the perturbed numerics of make nbval"
    return dict(item.split("=", 1) for item in line.group(1).split())


def probe(extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_", "OMP_"))} | extra
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_make_nbval_runs_the_notebooks_under_numerics():
    recipe = (ROOT / "Makefile").read_text().split("\nnbval:", 1)[1].split("\n\n", 1)[0]
    assert "$(NUMERICS)" in recipe and "pytest" in recipe.split("$(NUMERICS)", 1)[1], recipe


def test_numerics_take_another_code_path_and_round_differently():
    settings = numerics()
    assert {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS"} <= settings.keys(), settings
    native = probe({"OMP_NUM_THREADS": "2"})  # as `make outputs` runs on a 2-core machine
    perturbed = probe(settings)
    assert perturbed[:2] == ["DEFAULT", "1"], perturbed  # ATen's scalar kernels, one thread
    if native[0] != "DEFAULT":  # on a CPU with vector kernels, the sums must come out otherwise
        assert perturbed[2:] != native[2:], (native, perturbed)
