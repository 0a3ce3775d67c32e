"""Helpers of the browser tests (the site's, test_site.py, and others): scripts run in pages, a server, Chromium.

Chromium is Debian's headless one, driven by Selenium through chromedriver, with its console and performance logs
on: every request a page makes is recorded. Screenshots of every page go to build/screenshots/, those of the parts
a reader uses (figures, wide code and formulas, the header's buttons, search opened as a file, the landing page's
Quick start) to build/site-shots/.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
import urllib.parse
from pathlib import Path

import pytest

from tools.build_site import API_MODULES

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SHOTS = ROOT / "build" / "screenshots"
PART_SHOTS = ROOT / "build" / "site-shots"
WINDOW = (1280, 1600)  # a laptop's width: the page's contents sit beside the text column from 1200 px on
LAUNCH_HOSTS = ("colab.research.google.com", "mybinder.org")
RAW_TEX = re.compile(r"\\(frac|sqrt|mathrm)\b|\\[([]|\$[^$\s][^$]*\$")  # TeX left: commands, \( \[ or $...$

# Every <img> of the page's article: its natural and shown size, the link around it, the room its cell output
# gives it and the width of the text column (the cell's), and how many distinct colours a sample of its pixels has.
IMAGES_JS = """
return Array.from(document.querySelectorAll('article img')).map(img => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  let distinct = 0;
  if (c.width && c.height) {
    const ctx = c.getContext('2d');
    ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data, seen = new Set();
    for (let i = 0; i < d.length && seen.size < 8; i += 4 * 97) seen.add(d.slice(i, i + 4).join());
    distinct = seen.size;
  }
  const output = img.closest('.cell_output'), cell = img.closest('.cell'), link = img.closest('a');
  return {src: img.src, width: img.naturalWidth, height: img.naturalHeight, distinct: distinct,
          shown: img.getBoundingClientRect().width, href: link ? link.href : null,
          room: output ? output.clientWidth : null, column: cell ? cell.clientWidth : null};
});
"""
# Resolves once every image has loaded (or failed) and MathJax, where the page loads it, has typeset everything.
SETTLED_JS = """
const done = arguments[arguments.length - 1];
const images = Array.from(document.images).map(img => img.decode().catch(() => null));
const math = () => new Promise(resolve => {
  let tries = 100;
  const wait = () => {
    if (!document.querySelector('script[src*="mathjax"]')) return resolve('no mathjax');
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) return MathJax.startup.promise.then(resolve);
    if (--tries > 0) setTimeout(wait, 100); else resolve('MathJax never started');
  };
  wait();
});
Promise.all([...images, math()]).then(r => done(r.at(-1) === 'MathJax never started' ? r.at(-1) : true),
                                      e => done(String(e)));
"""
# The article's visible prose: code, outputs and typeset math taken out.
PROSE_JS = """
const article = document.querySelector('article').cloneNode(true);
article.querySelectorAll('pre, code, script, style, mjx-container, .cell_output, .output').forEach(e => e.remove());
return {text: article.textContent, typeset: document.querySelectorAll('article mjx-container').length};
"""
NAV_LINKS_JS = """
const links = (selector, where) => Array.from(document.querySelectorAll(selector))
  .map(a => ({href: a.href, where: where, cls: a.className, text: a.textContent.trim()}));
return [...links('.bd-sidebar-primary a[href]', 'sidebar'), ...links('.prev-next-area a', 'prev-next')];
"""
# The widest element the selector matches whose content is wider than its box, brought into view: how it
# overflows, and whether a shadow (a background gradient) marks the side with more. SCROLL_JS scrolls it to its end.
WIDEST_JS = """
const found = Array.from(document.querySelectorAll(arguments[0]))
  .filter(e => e.scrollWidth > e.clientWidth + 8).sort((a, b) => b.scrollWidth - a.scrollWidth)[0];
if (!found) return null;
window.widest = found;
found.scrollIntoView({block: 'center'});
const style = getComputedStyle(found);
return {overflow: style.overflowX, client: found.clientWidth, content: found.scrollWidth,
        shadow: style.backgroundImage.includes('gradient')};
"""
SCROLL_JS = "window.widest.scrollLeft = window.widest.scrollWidth; return window.widest.scrollLeft;"
# Whether the page's contents (the secondary side bar) are drawn over the element given.
OVERLAP_JS = """
const a = arguments[0].getBoundingClientRect();
const b = document.querySelector('.bd-sidebar-secondary').getBoundingClientRect();
return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
"""
# The search page's results once its search has finished and every excerpt has come (or 5 s more have passed):
# each result's link, kind and excerpt; null if the search never finished. A function, class... (kind-object) gets
# its description instead of an excerpt (a span).
SEARCH_RESULTS_JS = """
const done = arguments[arguments.length - 1], started = Date.now();
let finished = null;
const wait = () => {
  const status = document.querySelector('#search-results .search-summary');
  const items = Array.from(document.querySelectorAll('#search-results ul.search li'));
  if (status && /found|did not match/.test(status.textContent)) {
    finished = finished || Date.now();
    if (items.every(li => li.querySelector('p.context, span')) || Date.now() - finished > 5000)
      return done(items.map(li => ({href: li.querySelector('a').href, kind: li.className,
                                    excerpt: (li.querySelector('p.context') || {}).textContent || null})));
  } else if (Date.now() - started > 30000) return done(null);
  setTimeout(wait, 50);
};
wait();
"""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the tests report what matters; the server's log of every request is noise
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``folder`` on localhost from a thread; return the server (to shut down) and its base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def chromium(profile: Path):
    """Headless Chromium with its console and performance logs on; skips (fails in CI) without one."""
    if not (CHROMIUM and CHROMEDRIVER):
        message = "headless Chromium not found: install Debian's 'chromium' and 'chromium-driver' (.ci/run does)"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size={},{}".format(*WINDOW),
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    driver.get("about:blank")  # not the new-tab page, whose chrome:// requests would fill the first log
    return driver


def requested_urls(browser) -> list[str]:
    """The URLs of the requests the browser sent since the performance log was last read."""
    messages = (json.loads(entry["message"])["message"] for entry in browser.get_log("performance"))
    return [m["params"]["request"]["url"] for m in messages if m["method"] == "Network.requestWillBeSent"]


def save_shot(browser, name: str, folder: Path = PART_SHOTS) -> Path:
    """A screenshot of what the browser shows, as ``folder``/``name``.png."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    browser.save_screenshot(str(path))
    return path


def open_page(browser, url: str, shot: str | None = None) -> dict:
    """Load a page and wait until it has settled; return its console errors and the URLs it requested."""
    browser.get_log("browser")  # drop what earlier pages left in the logs
    browser.get_log("performance")
    browser.get(url)
    settled = browser.execute_async_script(SETTLED_JS)
    if shot:
        save_shot(browser, shot, SHOTS)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    return {"settled": settled, "errors": errors, "requests": requested_urls(browser)}


def small_site(folder: Path, repository_url: str) -> Path:
    """Build, in this process, a site of one lesson notebook (notebooks/01_tiny) with tools/site/conf.py and
    ``repository_url`` as the repository's address; return the built site's folder (a few seconds, not the
    series' 25)."""
    import nbformat
    from sphinx.cmd.build import build_main

    from tools.build_site import sphinx_command

    source = folder / "source"
    (source / "notebooks").mkdir(parents=True)
    cells = [nbformat.v4.new_markdown_cell("# 01 · A tiny lesson\n\nOne formula: $\\sqrt{d}$."),
             nbformat.v4.new_code_cell("print(6 * 7)")]  # fmt: skip
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, source / "notebooks" / "01_tiny.ipynb")
    (source / "index.md").write_text("# The series\n\n```{toctree}\nnotebooks/01_tiny\n```\n", encoding="utf-8")
    command = sphinx_command(source, folder / "html", folder / "doctrees", repository_url)
    assert build_main(command[command.index("sphinx") + 1 :]) == 0, "the small site did not build"
    return folder / "html"


def has_math(page: str) -> bool:
    """Whether the page's source writes any formula: TeX in a markdown cell, or a docstring's math directive."""
    if page == "api.html":
        files = [ROOT / "mha_tutorial" / (name.replace(".", "/") + ".py") for name in API_MODULES]
        return any(".. math::" in f.read_text() for f in files if f.exists())
    if page == "docs/teaching.html":
        return "$" in (ROOT / "docs" / "teaching.md").read_text()
    cells = json.loads((ROOT / page.replace(".html", ".ipynb")).read_text())["cells"]
    return any("$" in "".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def search(browser, url: str, shot: str) -> tuple[list[dict], list]:
    """Run the search page at ``url``; return its results (link, excerpt) and the console's errors."""
    browser.get_log("browser")
    browser.get(url)
    results = browser.execute_async_script(SEARCH_RESULTS_JS)
    save_shot(browser, shot)
    assert results, f"{url}: the search found nothing or never finished"
    return results, [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def assert_excerpts(results: list[dict]) -> None:
    """Every result but an object's (a function's...) has an excerpt, none with a formula's TeX in it."""
    assert all(r["excerpt"] for r in results if r["kind"] != "kind-object"), [r for r in results if not r["excerpt"]]
    raw = [r["excerpt"] for r in results if r["excerpt"] and RAW_TEX.search(r["excerpt"])]
    assert not raw, f"TeX in an excerpt: {raw[0]}"


def addresses_shown(html: str) -> list[str]:
    """What in a built page shows a repository address: a launch button or repository link (tools/site/
    header_links.py), a link to Colab or Binder, a remote image (a badge)."""
    kinds = ("launch-buttons", "launch-binder-button", "launch-colab-button", "source-repository-button")
    found = [kind for kind in kinds if kind in html]
    found += [a for a in re.findall(r'<a[^>]+href="([^"]+)"', html) if urllib.parse.urlsplit(a).netloc in LAUNCH_HOSTS]
    return found + [img for img in re.findall(r'<img[^>]+src="([^"]+)"', html) if urllib.parse.urlsplit(img).scheme]


def mathjax_shipped(folder: Path) -> tuple[set[str], set[str], int]:
    """The files under the site's _static/mathjax, those of them that are fonts tex-chtml.js declares (its style
    sheet names every font it may use; the browser fetches those a page's glyphs need), and their bytes."""
    files = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    declared = (folder / "tex-chtml.js").read_text(encoding="utf-8")
    fonts = {name for name in files if name.endswith(".woff") and Path(name).stem in declared}
    return files, fonts, sum((folder / name).stat().st_size for name in files)
