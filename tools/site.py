"""Render the series as a static site that works offline (``make run``).

    python tools/site.py --out build/site build/notebooks/*.ipynb    # what `make run` does after executing them
    python tools/site.py                                            # render the notebooks' committed outputs

The site has an index page in series order (title, one-line summary and time to
run of each notebook), one HTML page per notebook with its figures embedded, and
an API reference for ``mha_tutorial`` generated from its docstrings. Math is
typeset at build time: every ``$...$`` and ``$$...$$`` of the markdown cells becomes
MathML (with ``latex2mathml``), which browsers draw natively, so no page loads
a script, a font or anything else from the network.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = Path(__file__).resolve().parent / "site_templates"
API_MODULES = [
    "attention",
    "masks",
    "heads",
    "mha",
    "variants",
    "tasks",
    "task_base",
    "model",
    "train",
    "viz",
    "figures",
    "maps",
    "head_stats",
    "pruning",
    "bench",
    "bench_report",
    "checks",
    "device",
]

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.5; }
table { border-collapse: collapse; width: 100%; } td, th { border-bottom: 1px solid #ddd; padding: .5rem; text-align: left; }
code, pre { font-family: ui-monospace, monospace; } pre { background: #f6f8fa; padding: .75rem; overflow-x: auto; }
h3 { margin-top: 2rem; } .sig { font-weight: 600; }
"""


def series_notebooks() -> list[Path]:
    """The core notebooks (NN_name) and the optional deep dives (NNa_name), in series order (04 before 04a)."""
    found = [*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"), *(ROOT / "notebooks").glob("[0-9][0-9][a-z]_*.ipynb")]
    return sorted(found, key=lambda p: p.name)


def readme_summaries() -> dict[str, str]:
    """The one-line summary of each notebook from the README's series table (the one place it is written)."""
    readme = ROOT / "README.md"
    if not readme.exists():
        return {}
    row = re.compile(r"^\|\s*\d+[a-z]?\s*\|\s*\[[^]]*\]\(notebooks/([^)]+)\)\s*\|\s*(.+?)\s*\|\s*$", re.M)
    return dict(row.findall(readme.read_text()))


def title_of(nb) -> str:
    """The notebook's first '# ' heading."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = next((ln for ln in cell.source.splitlines() if ln.startswith("# ")), None)
            if heading is not None:
                return heading[2:].strip()
    return "(untitled)"


def run_seconds(nb) -> float | None:
    """Time from the first cell's start to the last cell's reply, as nbclient recorded it."""
    stamps = []
    for cell in nb.cells:
        timing = cell.get("metadata", {}).get("execution", {})
        for key in ("iopub.execute_input", "shell.execute_reply"):
            if key in timing:
                stamps.append(dt.datetime.fromisoformat(timing[key].replace("Z", "+00:00")))
    return (max(stamps) - min(stamps)).total_seconds() if len(stamps) >= 2 else None


# In the rendered HTML, math is only looked for outside code: <pre>, <code>, <script> and <style>
# elements (code cells, outputs, inline code) are matched first and kept as they are.
HTML_MATH = re.compile(
    r"(<(pre|code|script|style)\b.*?</\2>)|\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)([^$\n<>]+?)(?<!\s)\$", re.S
)


def typeset_math(page: str) -> str:
    """Replace $$display$$ and $inline$ TeX in rendered HTML by MathML; TeX it cannot read stays as code."""
    from latex2mathml.converter import convert

    def replace(match: re.Match) -> str:
        code, _, display, inline = match.groups()
        if code is not None:
            return code
        tex = html.unescape(display if display is not None else inline).strip()
        try:
            mathml = convert(tex, display="block" if display is not None else "inline")
        except Exception:  # noqa: BLE001 -- an unreadable formula is shown as TeX source, not dropped
            return f"<code>{html.escape(tex)}</code>"
        return f"<div class='math-display'>{mathml}</div>" if display is not None else mathml

    return HTML_MATH.sub(replace, page)


def render_notebook(nb, target: Path) -> None:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="offline", embed_images=True)
    body, _ = exporter.from_notebook_node(nb)
    target.write_text(typeset_math(body))


def api_page(site: Path) -> None:
    """One section per module: each public function and class with its signature and docstring."""
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mha_tutorial API</title><link rel='icon' href='data:,'><style>{STYLE}</style>"
        "</head><body><p><a href='index.html'>&larr; the series</a></p><h1><code>mha_tutorial</code> API reference</h1>"
    ]
    for name in API_MODULES:
        try:
            module = importlib.import_module(f"mha_tutorial.{name}")
        except ImportError:
            continue
        parts.append(
            f"<h2 id='{name}'><code>mha_tutorial.{name}</code></h2><pre>{html.escape(inspect.getdoc(module) or '')}</pre>"
        )
        public = getattr(module, "__all__", None) or [
            n
            for n, obj in vars(module).items()
            if not n.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and getattr(obj, "__module__", "").startswith(module.__name__)
        ]
        for member_name in public:
            obj = getattr(module, member_name)
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = ""
            kind = "class" if inspect.isclass(obj) else "def"
            parts.append(
                f"<h3 id='{name}.{member_name}'><span class='sig'>{kind} {member_name}</span>"
                f"<code>{html.escape(sig)}</code></h3><pre>{html.escape(inspect.getdoc(obj) or '')}</pre>"
            )
            if inspect.isclass(obj):
                for meth_name, meth in vars(obj).items():
                    if inspect.isfunction(meth) and not meth_name.startswith("_") and meth.__doc__:
                        parts.append(
                            f"<p><code>.{meth_name}{html.escape(str(inspect.signature(meth)))}</code></p>"
                            f"<pre>{html.escape(inspect.getdoc(meth))}</pre>"
                        )
    parts.append("</body></html>")
    (site / "api.html").write_text("\n".join(parts))


def _inline_code(markdown: str) -> str:
    """Escape a line of README markdown for HTML, keeping its `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(markdown))


def index_page(site: Path, entries: list[dict]) -> None:
    rows = "\n".join(
        f"<tr><td>{i + 1:02d}</td><td><a href='{e['href']}'>{html.escape(e['title'])}</a></td>"
        f"<td>{_inline_code(e['summary'])}</td><td>{e['time']}</td></tr>"
        for i, e in enumerate(entries)
    )
    (site / "index.html").write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Multi-Head Attention from Scratch</title><link rel='icon' href='data:,'>"
        f"<style>{STYLE}</style></head><body><h1>Multi-Head Attention from Scratch</h1>"
        "<p>An executable notebook series that builds attention from the ground up in PyTorch. "
        "Read the notebooks in order; each one ends with exercises you can check automatically.</p>"
        f"<table><thead><tr><th>#</th><th>notebook</th><th>what it teaches</th><th>time to run</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        "<p>Reference: <a href='api.html'>the <code>mha_tutorial</code> API</a>.</p></body></html>"
    )


def build(notebooks: list[Path], site: Path) -> list[dict]:
    import nbformat

    site.mkdir(parents=True, exist_ok=True)
    summaries = readme_summaries()
    entries = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        seconds = run_seconds(nb)  # from nbclient's timing metadata, when the notebook was just executed
        title, summary = title_of(nb), summaries.get(path.name, "")
        href = path.with_suffix(".html").name
        render_notebook(nb, site / href)
        entries.append(
            {
                "href": href,
                "title": title,
                "summary": summary,
                "time": f"{seconds:.0f} s" if seconds is not None else "–",
            }
        )
        print(f"{path.name}: {entries[-1]['time']} -> {site / href}", flush=True)
    index_page(site, entries)
    api_page(site)
    print(f"site written to {site / 'index.html'}")
    return entries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="default: the series, core notebooks and deep dives, in order"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or series_notebooks()
    build(notebooks, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
