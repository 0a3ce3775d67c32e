"""Shared by the tooling tests: the environment of a learner without the repository (tools/wheel_env.py)."""

import pytest

from tools.wheel_env import build


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory):
    """(python, site-packages) of a fresh venv holding the wheel of mha_tutorial and only its declared
    dependencies (plus a Jupyter kernel)."""
    return build(tmp_path_factory.mktemp("wheel"))
