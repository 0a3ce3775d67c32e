"""Sphinx extension: a notebook's figures open at full size when clicked, and take the page's full width.

The figures are drawn at 100 dpi, most of them 800 to 1,450 pixels wide, with 8 pt type: shrunk into the text
column (about 700 pixels on a 1280-pixel screen) their labels are hard to read. So each figure output

- is a link to its image file, which the browser shows at its natural size (and can zoom);
- gets the class ``wide-figure``: it spans the column and the margin where the page's contents sit (the site's
  style sheet, _static/site.css, which also keeps a figure from being scaled up), and the contents fold away
  while such a figure is on the screen (_static/site.js), as the book theme does for its full-width cells.
"""

from __future__ import annotations

import posixpath

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

OUTPUT = "cell_output"  # myst-nb's class for the outputs of a code cell
IMAGES = "_images"  # where the HTML builder copies every image, under the names in env.images
WIDE = "wide-figure"  # the class _static/site.css widens and _static/site.js watches


def cell_output(node: nodes.Node) -> nodes.Element | None:
    """The container of the code cell's outputs that holds ``node``, if any."""
    parent = node.parent
    while parent is not None and OUTPUT not in parent.get("classes", []):
        parent = parent.parent
    return parent


class LinkFigures(SphinxPostTransform):
    """Wrap each image of a cell output in a link to the copy the HTML builder puts in _images/, mark the output."""

    default_priority = 900
    formats = ("html",)

    def run(self, **kwargs) -> None:
        folder = posixpath.relpath(IMAGES, posixpath.dirname(self.env.docname) or ".")  # from the page's folder
        for image in list(self.document.findall(nodes.image)):
            output = cell_output(image)
            candidate = image.get("candidates", {}).get("*")  # a local file; data: and remote images have "?"
            if output is None or candidate not in self.env.images or isinstance(image.parent, nodes.reference):
                continue
            link = nodes.reference("", "", refuri=posixpath.join(folder, self.env.images[candidate][1]))
            link["classes"].append("figure-link")
            image.replace_self(link)
            link.append(image)
            if WIDE not in output["classes"]:
                output["classes"].append(WIDE)


def setup(app):
    app.add_post_transform(LinkFigures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
