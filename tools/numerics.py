"""The numeric code paths `make nbval` checks the committed outputs on: other paths than `make outputs` wrote them
with (this machine's own ATen kernels, MKL's own branch, two threads), so that float32 rounding moves as it does
from one CPU to another.

    python tools/numerics.py     # prints the settings as KEY=VALUE words, for the Makefile's NUMERICS

* ATen's kernels: on an AVX-512 CPU, its AVX2 kernels, the set most learners' laptops run (vectors half as wide,
  so sums of products land in another order); on any other CPU, its scalar kernels (slower by about a tenth on the
  notebooks here, hence not used where AVX2 is a different path already).
* MKL's conditional-numerical-reproducibility branch for AVX CPUs (no FMA): not the AVX2 or AVX-512 code MKL picks by
  itself, and about twice as fast as its COMPATIBLE branch.
* One thread: reductions split across threads no longer, so partial sums are added in another order.

tests/tooling/test_perturbed_numerics.py proves these settings change the code path and the rounding.
"""

from __future__ import annotations

import torch


def other_kernels(native: str) -> str:
    """The ATen kernel set to check on, given the one this CPU runs by itself (torch's get_cpu_capability())."""
    return "avx2" if native == "AVX512" else "default"


def numerics(native: str | None = None) -> dict[str, str]:
    """The environment settings of `make nbval`'s perturbed numerics."""
    native = native or torch.backends.cpu.get_cpu_capability()
    return {
        "ATEN_CPU_CAPABILITY": other_kernels(native),
        "MKL_CBWR": "AVX",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


if __name__ == "__main__":
    print(" ".join(f"{key}={value}" for key, value in numerics().items()))
