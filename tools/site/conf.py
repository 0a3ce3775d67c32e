"""Sphinx configuration of the series' site; tools/build_site.py assembles the source tree and runs Sphinx.

The notebooks are rendered with the outputs they already have (myst-nb never executes them). Nothing
is fetched from the network by a page: MathJax is the part of sphinx-mathjax-offline's copy that the pages load,
and the theme's fonts and icons are files of the theme. The extensions beside this file:

- offline_assets: copies that part of MathJax, and drops the themes' source maps;
- figure_links: each figure of a notebook links to its full-size image and takes the page's full width
  (_static/site.css and site.js style it);
- header_links: the repository link and the Binder / Colab buttons, from ``mha_repository_url`` below;
- search_excerpts: the search page shows excerpts also when the site is opened as a file.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the extensions beside this file; tools.project

from tools.project import repository_url  # noqa: E402

project = "Multi-Head Attention from Scratch"
author = "the Multi-Head Attention from Scratch authors"  # as CITATION.cff names them
copyright = "code MIT, prose CC BY 4.0"  # noqa: A001 -- the name Sphinx reads

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "offline_assets",  # MathJax 3's tex-chtml.js and what it loads, copied into _static/mathjax/
    "figure_links",
    "header_links",
    "search_excerpts",
]

# The repository's public address: pyproject's [project.urls] Repository (tools/project.py), None while unset.
# `-D mha_repository_url=...` replaces it for one build (tools/build_site.py --repository-url).
mha_repository_url = repository_url()

# The notebooks were executed before (by `make run`, or when their outputs were committed).
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type"]

exclude_patterns = ["**.ipynb_checkpoints"]

# The API page: the docstrings are Google style ("Args:", "Returns:") with reST math.
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # not torch's "Define the computation performed at every call" on each forward
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = project
html_favicon = "_static/favicon.svg"  # without one the browser asks for /favicon.ico, which is not there
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_js_files = [("site.js", {"defer": "defer"})]
html_copy_source = True  # into _sources/: each notebook's page offers its .ipynb for download from there
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": True,  # the page's source (a notebook's .ipynb) from _sources/, and print to PDF
    "use_fullscreen_button": True,
    "use_repository_button": False,  # header_links adds it, with the launch buttons, from mha_repository_url
    "launch_buttons": {},
    "navbar_start": [],  # the header bar above the page repeated the side bar's search box
    "navbar_center": [],
    "navbar_end": [],
    "navbar_persistent": [],
    "analytics": {},
    "navigation_with_keys": False,
    "show_prev_next": True,
}
html_context = {"default_mode": "light"}  # the figures have white backgrounds; unset, the theme logs an error
