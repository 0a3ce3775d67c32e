"""`make nbval` checks the committed outputs on other numeric code paths than `make outputs` wrote them with
(tools/numerics.py, the Makefile's NUMERICS): here we prove those settings really change the path and the float32
rounding, so that a green nbval means the outputs reproduce where the rounding differs (another CPU, another BLAS
path, other threads).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.numerics import numerics, other_kernels

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import torch
g = torch.Generator().manual_seed(0)
a, b = torch.randn(8, 128, 384, generator=g), torch.randn(384, 384, generator=g)
x = torch.randn(64, 384, generator=g)
print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
print(repr((a @ b).sum().item()), repr(torch.nn.functional.layer_norm(x, (384,)).sum().item()))
"""


def probe(extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_", "OMP_"))} | extra
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_make_nbval_runs_the_notebooks_under_numerics():
    makefile = (ROOT / "Makefile").read_text()
    assert "NUMERICS = $(shell $(PY) tools/numerics.py)" in makefile
    recipe = makefile.split("\nnbval:", 1)[1].split("\n\n", 1)[0]
    assert 'test -n "$(NUMERICS)"' in recipe  # an empty NUMERICS (the script failed) stops nbval
    assert "$(NUMERICS)" in recipe and "pytest" in recipe.split("$(NUMERICS)", 1)[1], recipe


def test_the_script_prints_the_settings_for_make():
    run = subprocess.run([sys.executable, "tools/numerics.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert dict(word.split("=", 1) for word in run.stdout.split()) == numerics()


@pytest.mark.parametrize(
    ("native", "other"), [("AVX512", "avx2"), ("AVX2", "default"), ("DEFAULT", "default"), ("ZVECTOR", "default")]
)
def test_an_avx512_cpu_is_checked_on_avx2_kernels_any_other_on_scalar_ones(native, other):
    assert other_kernels(native) == other
    assert numerics(native)["ATEN_CPU_CAPABILITY"] == other


def test_numerics_take_another_code_path_and_round_differently():
    settings = numerics()
    assert {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS"} <= settings.keys(), settings
    native = probe({"OMP_NUM_THREADS": "2"})  # as `make outputs` runs on a 2-core machine
    perturbed = probe(settings)
    assert perturbed[1] == "1", perturbed  # one thread
    assert perturbed[0] == settings["ATEN_CPU_CAPABILITY"].upper(), perturbed  # the kernels asked for
    if native[0] != "DEFAULT":  # on a CPU with vector kernels: another kernel set, and the sums come out otherwise
        assert perturbed[0] != native[0], (native, perturbed)
        assert perturbed[2:] != native[2:], (native, perturbed)
