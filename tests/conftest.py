"""Fixtures shared by every test: the global RNG seeded, figures closed, the property-test profile, the committed
checkpoints. Helpers that tests import (references, guards) live in ``testkit.py``, an importable module.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # figures are drawn, never shown, in every test

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: derandomized by default so that `make test` gives the same
# verdict on every run; HYPOTHESIS_PROFILE=explore searches more, at random.
settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def models():
    """The three committed checkpoints, loaded fresh for each test module (some tests prune them in place)."""
    from mha_tutorial.models.train import load_pretrained

    return {name: load_pretrained(name, device="cpu") for name in ("reversal", "induction", "dates")}
