"""Build the series' website with Sphinx, myst-nb and the book theme (``make run``, ``make site``).

    python tools/build_site.py                               # from the notebooks' committed outputs
    python tools/build_site.py --notebooks build/notebooks   # from the copies `make run` just executed

The script assembles a Sphinx source tree (in build/site-work/source/) and builds it into build/site/
with the configuration in tools/site/conf.py:

- the notebooks in series order (core notebooks, each followed by its deep dive), rendered with the
  outputs they have: nothing is executed again. Each lesson with exercises is followed by its companion of
  worked solutions (``notebooks/solutions/NN_solutions.ipynb``), which its last cell links to: a lesson's page
  shows no solution;
- the landing page: the README's series section, with each notebook's time to run when the folder holds
  the ``timings.json`` that tools/run_notebooks.py writes (and no such column when it does not), then the
  README's Quick start section;
- the teaching guide (docs/teaching.md) and an API reference that autodoc generates from the docstrings.

Every script, style sheet and font a page uses is copied into the site, so it works offline; of MathJax only
what the pages load (tools/site/offline_assets.py). Each notebook's page offers its .ipynb for download and, when
``[project.urls] Repository`` in pyproject.toml is set, a repository link and Binder / Colab launch buttons
(tools/site/header_links.py; ``--repository-url`` overrides the address for one build, ``--repository-url ''``
builds without one).
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import tools.series

from tools.run_notebooks import TIMINGS  # noqa: E402
from tools.series import ROOT, companion, series_notebooks  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent / "site"
API_MODULES = [  # by part, in the order the series meets them (README's table)
    "core.attention",
    "core.masks",
    "core.heads",
    "core.mha",
    "core.variants",
    "core.kv_cache",
    "core.rope",
    "models.tasks",
    "models.task_base",
    "models.model",
    "models.blocks",
    "models.train",
    "analysis.viz",
    "analysis.maps",
    "analysis.head_stats",
    "analysis.pruning",
    "pretrained.bert",
    "pretrained.minilm",
    "pretrained.bert_heads",
    "pretrained.retrieval",
    "pretrained.llama",
    "pretrained.smollm",
    "pretrained.smollm_study",
    "pretrained.llama_hf",
    "modern.flash",
    "modern.gqa",
    "modern.length_study",
    "modern.gqa_study",
    "bench.attention",
    "bench.report",
    "bench.decode",
    "bench.flash",
    "figures",
    "checks",
    "device",
]
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def pages(notebook_dir: Path) -> list[Path]:
    """The notebooks of the site in reading order: each lesson, then its companion of solutions when it has one."""
    found = []
    for lesson in series_notebooks(notebook_dir):
        found += [lesson, *[c for c in [companion(lesson)] if c.exists()]]
    return found


def read_timings(folder: Path) -> dict[str, float]:
    """Seconds each notebook took to run, from the timings.json of an executed folder; {} when there is none."""
    path = folder / TIMINGS
    return json.loads(path.read_text()) if path.exists() else {}


def readme_section(readme: str, heading: str, *, from_title: bool = False) -> str:
    """The README's ``## heading`` section (from the README's title on when ``from_title``), up to the next one."""
    start = readme.index(f"\n## {heading}\n") + 1
    end = readme.find("\n## ", start)
    return readme[0 if from_title else start : end if end >= 0 else len(readme)].rstrip() + "\n"


def badges_as_links(markdown: str) -> str:
    """Badges (images on another host, e.g. "Open in Colab") become text links: the site loads nothing from afar."""
    linked = re.sub(r"\[!\[([^\]]*)\]\((?:https?:)?//[^)\s]+\)\]\(([^)\s]+)\)", r"[\1](\2)", markdown)
    return re.sub(r"!\[([^\]]*)\]\((?:https?:)?//[^)\s]+\)", r"\1", linked)


def with_timings(markdown: str, timings: dict[str, float]) -> str:
    """Add a "time to run" column to the series table: the seconds of each notebook, "–" where none."""
    if not timings:
        return markdown
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        notebook = re.search(r"\]\(notebooks/([^)]+\.ipynb)\)", line)
        if line.startswith("| # |"):
            lines[i] = line + " Time to run |"
        elif line.startswith("|---") and i > 0 and lines[i - 1].startswith("| # |"):
            lines[i] = line + "------------:|"
        elif line.startswith("|") and notebook:
            seconds = timings.get(notebook.group(1))
            lines[i] = line + (f" {seconds:.0f} s |" if seconds is not None else " – |")
    return "\n".join(lines) + "\n"


def unlink_missing(markdown: str, page: Path, source: Path) -> str:
    """Links to files the site does not have become plain text that names the file in the repository.

    ``page`` is where the markdown goes in the source tree ``source``, whose folders mirror the repository's.
    """

    def replace(match: re.Match) -> str:
        text, target = match.groups()
        if re.match(r"[a-z]+:|#", target) or (page.parent / target.split("#")[0]).exists():
            return match.group(0)
        in_repository = posixpath.normpath(f"{page.parent.relative_to(source).as_posix()}/{target}")
        return text if "/" in text else f"{text} (`{in_repository}` in the repository)"

    return LINK.sub(replace, markdown)


def toctree(caption: str, entries: list[str]) -> str:
    return "\n".join(["```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```", ""])


def index_page(source: Path, names: list[str], timings: dict[str, float]) -> None:
    """The landing page: the README's series section and its Quick start, and the side navigation of the site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = with_timings(readme_section(readme, "The series", from_title=True), timings)
    page = badges_as_links(page + "\n" + readme_section(readme, "Quick start"))
    page += "\nReference: the [teaching guide](docs/teaching.md) and the [`mha_tutorial` API](api.rst).\n\n"
    page += toctree("The series", [f"notebooks/{Path(name).with_suffix('').as_posix()}" for name in names])
    page += "\n" + toctree("Reference", ["docs/teaching", "api"])
    (source / "index.md").write_text(unlink_missing(page, source / "index.md", source), encoding="utf-8")


def api_page(source: Path) -> None:
    """One section per module of API_MODULES, each generated by autodoc from the module's docstrings."""
    title = "The ``mha_tutorial`` API"
    parts = [title, "=" * len(title), "", "Generated from the docstrings of the package the notebooks build.", ""]
    for name in API_MODULES:
        heading = f"``mha_tutorial.{name}``"
        parts += [heading, "-" * len(heading), "", f".. automodule:: mha_tutorial.{name}", ""]
    (source / "api.rst").write_text("\n".join(parts), encoding="utf-8")  # reST: the docstrings are written in it


def assemble(notebook_dir: Path, source: Path) -> list[str]:
    """Write the Sphinx source tree into ``source`` (emptied first); return the notebooks' names in order."""
    shutil.rmtree(source, ignore_errors=True)
    (source / "notebooks").mkdir(parents=True)
    (source / "docs").mkdir()
    notebooks = pages(notebook_dir)
    if not notebooks:
        raise SystemExit(f"no notebooks of the series in {notebook_dir}")
    (source / "notebooks" / "solutions").mkdir()
    for path in notebooks:
        shutil.copyfile(path, source / "notebooks" / path.relative_to(notebook_dir))
    guide = source / "docs" / "teaching.md"
    guide.write_text(unlink_missing((ROOT / "docs" / "teaching.md").read_text(encoding="utf-8"), guide, source))
    api_page(source)
    names = [path.relative_to(notebook_dir).as_posix() for path in notebooks]
    index_page(source, names, read_timings(notebook_dir))
    return names


def sphinx_command(source: Path, html: Path, doctrees: Path, repository_url: str | None = None) -> list[str]:
    """The command that builds ``source`` into ``html`` with tools/site/conf.py.

    ``repository_url`` replaces pyproject's ``[project.urls] Repository`` for this build ("" builds without one);
    None keeps pyproject's.
    """
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", "-c", str(CONF_DIR)]
    if repository_url is not None:
        command += ["-D", f"mha_repository_url={repository_url}"]
    return [*command, "-d", str(doctrees), str(source), str(html)]


def build(notebook_dir: Path, out: Path, work: Path, repository_url: str | None = None) -> float:
    """Assemble the source tree in ``work``, build the site there and move it to ``out``; return the seconds.

    Sphinx works in ``work`` (source/, doctrees/, html/, and myst-nb's jupyter_execute/ beside html/), so
    that nothing but the finished site lands in ``out``'s folder. ``repository_url``: see sphinx_command.
    """
    start = time.perf_counter()
    source, html = work / "source", work / "html"
    assemble(notebook_dir, source)
    shutil.rmtree(html, ignore_errors=True)
    command = sphinx_command(source, html, work / "doctrees", repository_url)
    subprocess.run(command, check=True, cwd=ROOT)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(html, out)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="default: the committed ones")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "site-work", help="Sphinx's source tree")
    parser.add_argument("--repository-url", help="instead of pyproject's [project.urls] Repository ('' for none)")
    args = parser.parse_args(argv)
    seconds = build(args.notebooks, args.out, args.work, args.repository_url)
    print(f"site built in {seconds:.1f} s: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
