"""Sphinx configuration of the series' site; tools/build_site.py assembles the source tree and runs Sphinx.

The notebooks are rendered with the outputs they already have (myst-nb never executes them). Nothing
is fetched from the network by a page: MathJax is the copy vendored by sphinx-mathjax-offline, and the
theme's fonts and icons are files of the theme.
"""

project = "Multi-Head Attention from Scratch"
author = "the Multi-Head Attention from Scratch authors"  # as CITATION.cff names them
copyright = "code MIT, prose CC BY 4.0"  # noqa: A001 -- the name Sphinx reads

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static/mathjax/ and loaded from there
]

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
html_copy_source = False  # the notebooks are in the repository; the site shows them, it does not ship them
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,  # it offers the page's source, which the site does not copy
    "use_fullscreen_button": True,
    "use_repository_button": False,
    "launch_buttons": {},  # no Binder / Colab / JupyterHub: they would need the network
    "analytics": {},
    "navigation_with_keys": False,
    "show_prev_next": True,
}
html_context = {"default_mode": "light"}  # the figures have white backgrounds; unset, the theme logs an error
