"""Sphinx extension: the site ships the MathJax files its pages load, and no source maps.

sphinx-mathjax-offline vendors the whole MathJax 3 distribution (24 MB) and copies all of it; this extension takes
its files from there and copies only what ``tex-chtml.js`` (the one script the pages load) fetches:

- the CommonHTML fonts that its style sheet declares (22 of the 23 in ``output/chtml/fonts/woff-v2``, 0.4 MB):
  the browser fetches those whose glyphs a page shows;
- the TeX extensions that its ``autoload`` package fetches on the first use of a macro or environment it maps
  (``\\color`` fetches ``color.js``), and those named by ``\\require{...}``: for the macros that the site's formulas
  use, read from the pages it built.

The themes' ``*.map`` source maps (3.4 MB), which only a browser's developer tools ask for, are removed with the
comments that name them.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
from pathlib import Path

MATHJAX_PATH = "mathjax/tex-chtml.js"  # under _static/, as the pages load it
FONTS = "output/chtml/fonts/woff-v2"
EXTENSIONS = "input/tex/extensions"
AUTOLOAD = re.compile(r"autoload:\(0,\w+\.expandable\)\((\{[^{}]*\})\)")
MATH = re.compile(r'<(span|div) class="math[^"]*">(.*?)</\1>', re.S)
SOURCE_MAP = re.compile(r"\n?(?://# sourceMappingURL=\S+\.map|/\*# sourceMappingURL=\S+\.map \*/)\s*$")


def mathjax_source() -> Path:
    """The MathJax distribution that the sphinx-mathjax-offline package vendors."""
    spec = importlib.util.find_spec("sphinx-mathjax-offline")  # the package's name has dashes; it is never imported
    if spec is None or spec.origin is None:
        raise RuntimeError("sphinx-mathjax-offline is not installed: the site has no MathJax to copy")
    return Path(spec.origin).parent / "static" / "mathjax"


def autoload_table(script: str) -> dict[str, tuple[set[str], set[str]]]:
    """MathJax's autoload table, from tex-chtml.js: extension -> (macros, environments) that load it."""
    match = AUTOLOAD.search(script)
    if match is None:
        raise RuntimeError("tex-chtml.js has no autoload table where this MathJax version had one: check its layout")
    table = json.loads(re.sub(r"([{,])(\w+):", r'\1"\2":', match.group(1)))
    return {
        name: (set(value[0]), set(value[1])) if value and isinstance(value[0], list) else (set(value), set())
        for name, value in table.items()
    }


def formulas(outdir: Path) -> str:
    """The TeX of every formula on the site's pages (what Sphinx wrote into its ``math`` elements)."""
    found = [html.unescape(m.group(2)) for page in outdir.rglob("*.html") for m in MATH.finditer(page.read_text())]
    return "\n".join(found)


def needed_extensions(tex: str, table: dict[str, tuple[set[str], set[str]]]) -> set[str]:
    """The TeX extensions MathJax fetches to typeset ``tex``: autoloaded by a macro or environment, or required."""
    macros = set(re.findall(r"\\([A-Za-z]+)", tex))
    environments = set(re.findall(r"\\begin\{([A-Za-z*]+)\}", tex))
    needed = {name for name, (m, e) in table.items() if macros & m or environments & e}
    needed |= {name.strip() for names in re.findall(r"\\require\{([^}]*)\}", tex) for name in names.split(",")}
    return needed


def mathjax_files(source: Path, tex: str) -> list[str]:
    """The files under ``source`` (a MathJax distribution) that pages with the formulas ``tex`` load."""
    script = (source / "tex-chtml.js").read_text(encoding="utf-8")
    table = autoload_table(script)
    fonts = sorted(f"{FONTS}/{path.name}" for path in (source / FONTS).glob("*.woff") if path.stem in script)
    extensions = [f"{EXTENSIONS}/{name}.js" for name in sorted(needed_extensions(tex, table))]
    missing = [name for name in extensions if not (source / name).is_file()]
    if missing or not fonts:
        raise RuntimeError(f"MathJax in {source} lacks {missing or FONTS}")
    return ["tex-chtml.js", *fonts, *extensions]


def copy_mathjax(outdir: Path) -> list[str]:
    """Copy into ``outdir``/_static/mathjax the MathJax files the built pages load; return them."""
    source, target = mathjax_source(), outdir / "_static" / "mathjax"
    shutil.rmtree(target, ignore_errors=True)
    files = mathjax_files(source, formulas(outdir))
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target / name)
    return files


def drop_source_maps(static: Path) -> None:
    """Remove the ``*.map`` files under ``static`` and the comments in scripts and style sheets that name them."""
    for path in static.rglob("*.map"):
        path.unlink()
    for path in [*static.rglob("*.js"), *static.rglob("*.css")]:
        text = path.read_text(encoding="utf-8")
        stripped = SOURCE_MAP.sub("\n", text)
        if stripped != text:
            path.write_text(stripped, encoding="utf-8")


def on_build_finished(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        copy_mathjax(Path(app.outdir))
        drop_source_maps(Path(app.outdir) / "_static")


def setup(app):
    app.config.mathjax_path = MATHJAX_PATH
    app.connect("build-finished", on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
