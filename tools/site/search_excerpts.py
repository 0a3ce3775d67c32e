"""Sphinx extension: the search page shows an excerpt of each page it finds, also when opened as a file.

Sphinx's search page fetches each page it lists (``fetch()``) and cuts an excerpt from the page's main element. A
page opened from disk (file://) may fetch nothing, so there it lists titles only; over http its excerpts carry the
formulas' raw TeX (``\\(\\sqrt{d}\\)``), as the page was before MathJax ran.

So the build writes, for every page, a script ``_static/search-excerpts/<page>.js`` that hands the page's text over
(as HTML, made from the page's doctree: only what an excerpt is cut from, text and the ids that section and object
links point to; formulas as plain text, tools/site/tex_text.py), and the search page alone loads
_static/search_excerpts.js, which answers Sphinx's fetch of a page with it. A ``<script>`` loads from file://
where fetch() may not, so search works the same opened from disk or served; a page without its script is fetched
as before.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from docutils import nodes
from sphinx import addnodes

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside conf.py, as Sphinx loads it
from tex_text import tex_to_text  # noqa: E402

FOLDER = "search-excerpts"  # under _static/
SCRIPT = "search_excerpts.js"
SKIPPED = (nodes.image, nodes.comment, nodes.system_message, nodes.substitution_definition, nodes.target)
TAG = re.compile(r"<[^>]*>")


def excerpt_parts(node: nodes.Node) -> Iterator[str]:
    """The HTML of ``node`` as an excerpt needs it: text, ids (a section's, an object's), formulas as plain text."""
    if isinstance(node, nodes.Text):
        yield html.escape(str(node), quote=False)
    elif isinstance(node, nodes.math | nodes.math_block):
        block = isinstance(node, nodes.math_block)
        yield html.escape(f"\n{tex_to_text(node.astext())}\n" if block else tex_to_text(node.astext()), quote=False)
    elif isinstance(node, nodes.raw):  # a notebook's HTML output (a table): its text
        if "html" in node.get("format", "").split():
            yield html.escape(html.unescape(TAG.sub(" ", node.astext())), quote=False)
    elif isinstance(node, addnodes.desc_parameterlist):  # the HTML writer adds the brackets and commas
        yield html.escape(f"({', '.join(child.astext() for child in node.children)})", quote=False)
    elif not isinstance(node, SKIPPED):
        ids = node.get("ids", [])
        tag = "section" if isinstance(node, nodes.section) else "div"
        yield f'<{tag} id="{html.escape(ids[0])}">' if ids else ""
        for child in node.children:
            yield from excerpt_parts(child)
        yield f"</{tag}>" if ids else ""
        yield "" if isinstance(node, nodes.Inline) else "\n"


def write_excerpt(outdir: Path, docname: str, doctree: nodes.document) -> Path:
    """Write the excerpt script of the page ``docname`` (built from ``doctree``) into ``outdir``; return its path."""
    content = f'<div role="main">{"".join(excerpt_parts(doctree))}</div>'
    target = outdir / "_static" / FOLDER / f"{docname}.js"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"mhaSearchExcerpt({json.dumps(docname)}, {json.dumps(content)});\n", encoding="ascii")
    return target


def on_page(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search":
        app.add_js_file(SCRIPT)  # during html-page-context: for this page only


def on_doctree_resolved(app, doctree, docname) -> None:
    if app.builder.format == "html":
        write_excerpt(Path(app.outdir), docname, doctree)


def setup(app):
    app.connect("html-page-context", on_page)
    app.connect("doctree-resolved", on_doctree_resolved)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
