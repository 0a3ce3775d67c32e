"""Sphinx extension: the repository link of every page and the Binder / Colab launch buttons of each notebook.

All of them are made from one address, the config value ``mha_repository_url``, which conf.py reads from
pyproject's ``[project.urls] Repository`` through tools/project.py (``-D mha_repository_url=...`` overrides it for one
build; an empty value means none). tools/project.py also makes the launch links, as it does for the README's badges,
so that the site and the README open the same places. While the address is unset nothing is added: no button, no
link. Colab and Binder open notebooks from GitHub only, so off GitHub a page gets the repository link alone.

The buttons are entries of the book theme's article header (``header_buttons``), drawn like its own.
"""

from __future__ import annotations

from tools.project import binder_url, colab_url, github_slug

CONFIG = "mha_repository_url"


def notebook_path(app, pagename: str) -> str | None:
    """The repository path of the notebook a page shows (the source tree mirrors the repository); None if none."""
    if not pagename.startswith("notebooks/") or not str(app.env.doc2path(pagename)).endswith(".ipynb"):
        return None
    return f"{pagename}.ipynb"


def launch_buttons(url: str, notebook: str) -> list[dict]:
    """The launch entries for ``notebook``: Binder and Colab where tools/project.py has a link for ``url``."""
    links = [
        ("Binder", binder_url(url, notebook), "_static/images/logo_binder.svg", "launch-binder-button"),
        ("Colab", colab_url(url, notebook), "_static/images/logo_colab.png", "launch-colab-button"),
    ]
    tooltip = "Open this notebook on {}".format
    return [
        dict(type="link", text=name, tooltip=tooltip(name), icon=icon, url=link, label=label)
        for name, link, icon, label in links
        if link is not None
    ]


def header_buttons(url: str | None, notebook: str | None) -> list[dict]:
    """The theme header entries for a page: its notebook's launch buttons (if any), then the repository link."""
    if not url:
        return []
    buttons = []
    if notebook is not None and (launch := launch_buttons(url, notebook)):
        group = dict(type="group", tooltip="Run this notebook online", icon="fas fa-rocket", label="launch-buttons")
        buttons.append(group | {"buttons": launch})
    icon = "fab fa-github" if github_slug(url) else "fas fa-code-branch"
    buttons.append(dict(type="link", url=url, tooltip="Source repository", icon=icon, label="source-repository-button"))
    return buttons


def add_buttons(app, pagename, templatename, context, doctree) -> None:
    if "header_buttons" in context:  # the book theme's list, set up by its own handlers before this one
        url = getattr(app.config, CONFIG) or None
        context["header_buttons"].extend(header_buttons(url, notebook_path(app, pagename)))


def setup(app):
    app.add_config_value(CONFIG, None, "html", types=frozenset({str, type(None)}))
    app.connect("html-page-context", add_buttons, priority=510)  # after the book theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
