"""What learners expect of a teaching repository: one public address feeding every link (tools/project.py), a
version that agrees everywhere, a changelog, contribution notes and issue templates; and the PyTorch install that
picks the CPU build unless asked for CUDA (tools/install_torch.py)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml  # PyYAML comes with jupyterlab (via jupyter-events)

import mha_tutorial
from tools import install_torch, project

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "https://github.com/example-owner/mha-from-scratch"


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_and_citation_follow_the_one_setting():
    url = project.repository_url()
    assert project.readme_with_badges(readme(), url) == readme(), "README is stale: run `make conventions`"
    citation = (ROOT / "CITATION.cff").read_text()
    assert project.citation_with_url(citation, url) == citation, "CITATION.cff is stale: run `make conventions`"
    if url is None:  # no invented address anywhere a reader looks
        for name in ("README.md", "CITATION.cff", "docs/teaching.md", "CONTRIBUTING.md"):
            text = (ROOT / name).read_text()
            assert not re.search(r"colab\.research\.google\.com/github|mybinder\.org/v2|github\.com/[^<\s]+/", text), (
                f"{name} shows a repository address, but [project.urls] Repository is unset"
            )


def test_with_a_github_address_every_notebook_gets_colab_and_binder_badges():
    text = project.readme_with_badges(readme(), EXAMPLE)
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("[0-9][0-9]*.ipynb"))
    for path in notebooks:
        row = next(line for line in text.splitlines() if f"]({path})" in line)
        assert f"(https://colab.research.google.com/github/example-owner/mha-from-scratch/blob/main/{path})" in row
        assert f"(https://mybinder.org/v2/gh/example-owner/mha-from-scratch/HEAD?labpath={path})" in row
    assert "| # | Notebook | What it teaches | Run it |" in text.splitlines()
    assert project.readme_with_badges(text, EXAMPLE) == text, "running it twice adds the column twice"
    assert project.readme_with_badges(text, None) == project.readme_with_badges(readme(), None)


def test_an_address_off_github_gets_a_citation_but_no_launch_links():
    url = "https://codeberg.org/someone/mha"
    assert project.readme_with_badges(readme(), url) == project.readme_with_badges(readme(), None)
    assert project.colab_url(url, "notebooks/x.ipynb") is None and project.binder_url(url, "x") is None
    cff = yaml.safe_load(project.citation_with_url((ROOT / "CITATION.cff").read_text(), url))
    assert cff["repository-code"] == url


@pytest.mark.parametrize("value", ["http://github.com/a/b", "github.com/a/b", "ftp://x/y"])
def test_an_address_that_is_not_https_is_refused(tmp_path, value):
    (tmp_path / "pyproject.toml").write_text(f'[project.urls]\nRepository = "{value}"\n')
    with pytest.raises(ValueError, match="must be an https address"):
        project.repository_url(tmp_path / "pyproject.toml")


def test_the_version_agrees_everywhere_and_is_the_changelogs_newest():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert mha_tutorial.__version__ == version
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["version"] == version
    released = re.findall(r"^## (\d+\.\d+\.\d+) — (\d{4}-\d\d-\d\d)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0][0] == version, f"CHANGELOG.md's newest entry {released[:1]} is not {version}"
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["date-released"].isoformat() == released[0][1]


def test_contributing_and_issue_templates_exist_and_name_real_commands():
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"`make ([a-z-]+)", contributing):
        assert re.search(rf"^{target}:", makefile, re.M), (
            f"CONTRIBUTING.md names `make {target}`, which is not a target"
        )
    for name in ("erratum.md", "exercise-problem.md"):
        text = (ROOT / ".github/ISSUE_TEMPLATE" / name).read_text()
        front = yaml.safe_load(text.split("---")[1])
        assert {"name", "about", "title"} <= set(front), f"{name}: front matter lacks a field"


@pytest.mark.parametrize(
    ("build", "system", "reachable", "expected"),
    [
        ("cpu", "Linux", True, ["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"]),
        ("cpu", "Linux", False, ["torch==2.13.0"]),  # only the default index: still installs, with a message
        ("cpu", "Darwin", False, ["torch==2.13.0"]),  # PyPI's macOS and Windows wheels are the CPU build
        ("cpu", "Windows", False, ["torch==2.13.0"]),
        ("cuda", "Linux", False, ["torch==2.13.0"]),  # PyPI's Linux wheel is the CUDA build
    ],
)
def test_the_pip_command_for_each_case(build, system, reachable, expected):
    arguments, message = install_torch.pip_arguments(build, "2.13.0", system, reachable)
    assert arguments == expected
    assert ("cannot be reached" in message) == (build == "cpu" and system == "Linux" and not reachable)


def test_cuda_on_macos_and_an_unknown_build_are_refused():
    with pytest.raises(ValueError, match="PyTorch has no CUDA build for macOS"):
        install_torch.pip_arguments("cuda", "2.13.0", "Darwin", False)
    with pytest.raises(ValueError, match="TORCH must be 'cpu' or 'cuda', got 'rocm'"):
        install_torch.pip_arguments("rocm", "2.13.0", "Linux", True)


def test_the_version_comes_from_requirements_and_a_missing_pin_is_named(tmp_path):
    assert install_torch.pinned_version() == metadata.version("torch").split("+")[0]
    (tmp_path / "requirements.txt").write_text("numpy==2.4.6\n")
    with pytest.raises(ValueError, match="pins no torch==<version>"):
        install_torch.pinned_version(tmp_path / "requirements.txt")
