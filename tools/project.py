"""The project's public address, set in one place: ``Repository`` under ``[project.urls]`` in pyproject.toml.

Everything that links back to the repository reads it from here: the README's badges and CITATION.cff
(``python tools/project.py --write``), and the site's repository link and launch buttons (tools/site/conf.py).
While the key is unset (the series has no public address yet), nothing shows an address: no badge, no button,
no link. Colab and Binder open notebooks from GitHub only, so their links exist only for a github.com address.

    python tools/project.py            # prints the address, or says it is unset
    python tools/project.py --write    # rewrites README's badge column and CITATION.cff's repository-code
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
GITHUB = re.compile(r"^/(?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+?)(?:\.git)?/?$")
BRANCH = "main"


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str | None:
    """``[project.urls] Repository`` of ``pyproject``, without a trailing slash; None while it is unset.

    Raises:
        ValueError: the value is set but is not an https address.
    """
    urls = tomllib.loads(pyproject.read_text()).get("project", {}).get("urls", {})
    url = urls.get("Repository")
    if url is None:
        return None
    parsed = urlparse(url)
    if parsed.scheme != "https" or not parsed.netloc:
        raise ValueError(f"[project.urls] Repository in {pyproject} must be an https address, got {url!r}")
    return url.rstrip("/")


def github_slug(url: str | None) -> str | None:
    """``owner/name`` when ``url`` is a GitHub repository's address, else None."""
    if url is None or urlparse(url).netloc.lower() != "github.com":
        return None
    match = GITHUB.match(urlparse(url).path)
    return f"{match['owner']}/{match['repo']}" if match else None


def colab_url(url: str | None, notebook: str) -> str | None:
    """Where Colab opens ``notebook`` (a path in the repository, e.g. ``notebooks/01_x.ipynb``); None off GitHub."""
    slug = github_slug(url)
    return None if slug is None else f"https://colab.research.google.com/github/{slug}/blob/{BRANCH}/{notebook}"


def binder_url(url: str | None, notebook: str) -> str | None:
    """Where mybinder.org opens ``notebook`` in JupyterLab (built from binder/); None off GitHub."""
    slug = github_slug(url)
    return None if slug is None else f"https://mybinder.org/v2/gh/{slug}/HEAD?labpath={notebook}"


COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
HEADER, RULE = "| # | Notebook | What it teaches |", "|---|----------|-----------------|"
ROW = re.compile(r"^\| \d\d[a-z]? \| \[[^\]]+\]\((?P<path>notebooks/[^)]+\.ipynb)\) \|")
BADGES = " [![Open in Colab]("
PART = "| **Part II** |"


def _without_badges(line: str) -> str:
    """A line of the README with its "Run it" cell taken off (unchanged when it has none)."""
    if line.startswith((HEADER, RULE)):
        return line[: len(HEADER if line.startswith(HEADER) else RULE)]
    if ROW.match(line) and BADGES in line:
        return line[: line.index(BADGES)]
    if line.startswith(PART) and line.count("|") == 5:
        return line[: line.rstrip().rindex("|")].rstrip()
    return line


def _with_badges(line: str, url: str) -> str:
    """A line of the README (without badges) with its "Run it" cell: Colab and Binder badges for a notebook row."""
    if line.startswith(HEADER):
        return line + " Run it |"
    if line.startswith(RULE):
        return line + "--------|"
    if match := ROW.match(line):
        colab, binder = colab_url(url, match["path"]), binder_url(url, match["path"])
        return line + f"{BADGES}{COLAB_BADGE})]({colab}) [![Binder]({BINDER_BADGE})]({binder}) |"
    if line.startswith(PART):
        return line + " |"
    return line


def readme_with_badges(readme: str, url: str | None) -> str:
    """``readme`` with its series table's "Run it" column as ``url`` says: Colab and Binder badges per notebook for
    a GitHub address, no such column otherwise. Idempotent: the column is rebuilt, never appended twice."""
    lines = [_without_badges(line) for line in readme.split("\n")]
    if github_slug(url) is not None:
        lines = [_with_badges(line, url) for line in lines]
    return "\n".join(lines)


def citation_with_url(citation: str, url: str | None) -> str:
    """CITATION.cff with its ``repository-code`` line as ``url`` says (after ``version:``; none while unset)."""
    lines = [line for line in citation.split("\n") if not line.startswith("repository-code:")]
    if url is not None:
        at = next(i for i, line in enumerate(lines) if line.startswith("version:"))
        lines.insert(at + 1, f'repository-code: "{url}"')
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The repository's public address (pyproject's [project.urls]).")
    parser.add_argument("--write", action="store_true", help="rewrite README's badges and CITATION.cff from it")
    args = parser.parse_args(argv)
    url = repository_url()
    print(url or 'unset: add Repository = "https://github.com/<owner>/<name>" under [project.urls] in pyproject.toml')
    if args.write:
        for name, update in (("README.md", readme_with_badges), ("CITATION.cff", citation_with_url)):
            path = ROOT / name
            path.write_text(update(path.read_text(), url))
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
