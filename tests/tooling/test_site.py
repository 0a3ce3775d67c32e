"""The Sphinx site (make run, make site) builds in under a minute and works offline in a real browser.

The site is built once per module from the notebooks' committed outputs (strict nbval checks elsewhere
that those outputs are what the code produces), served from localhost and opened in Debian's Chromium
through Selenium and chromedriver. Each page is visited once: its console errors, every network request
it makes (from Chrome's performance log), its math, figures and links are recorded, and the tests below
judge them. One screenshot per page is kept under build/screenshots/. Without Chromium the browser tests
are skipped, except in CI (the environment variable CI set), where .ci/run installs it: there they fail.
"""

from __future__ import annotations

import functools
import html as html_module
import http.server
import json
import os
import re
import shutil
import threading
import urllib.parse
from pathlib import Path

import pytest

from tools.build_site import build, pages, read_timings, unlink_missing, with_timings
from tools.series import companion, series_notebooks

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
LESSON_PAGES = [f"notebooks/{p.stem}.html" for p in series_notebooks()]
# Every lesson, each followed by its companion of worked solutions where it has one.
NOTEBOOK_PAGES = [
    "notebooks/" + p.relative_to(ROOT / "notebooks").with_suffix(".html").as_posix() for p in pages(ROOT / "notebooks")
]
COMPANION_PAGES = [page for page in NOTEBOOK_PAGES if page not in LESSON_PAGES]
PAGES = ["index.html", *NOTEBOOK_PAGES, "docs/teaching.html", "api.html", "genindex.html", "search.html"]
SHOTS = ROOT / "build" / "screenshots"

# Every <img> of the page's article: its natural size and how many distinct colours a sample of its pixels has.
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
  return {src: img.getAttribute('src'), width: img.naturalWidth, height: img.naturalHeight, distinct: distinct};
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
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}
RAW_TEX = re.compile(r"\\(frac|sqrt|mathrm)\b|\\[([]|\$[^$\s][^$]*\$")  # TeX commands, \( \[ or $...$ left


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the tests report what matters; the server's log of every request is noise
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built from the committed notebooks into a temporary folder and served on localhost."""
    work = tmp_path_factory.mktemp("site")
    out = work / "html"
    seconds = build(ROOT / "notebooks", out, work / "work")
    print(f"site built in {seconds:.1f} s")
    handler = functools.partial(QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"out": out, "base": f"http://127.0.0.1:{server.server_address[1]}/", "seconds": seconds}
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
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
        "--window-size=1280,1600",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    driver.get("about:blank")  # not the new-tab page, whose chrome:// requests would fill the first log
    yield driver
    driver.quit()


def requested_urls(browser) -> list[str]:
    """The URLs of the requests the browser sent since the performance log was last read."""
    messages = (json.loads(entry["message"])["message"] for entry in browser.get_log("performance"))
    return [m["params"]["request"]["url"] for m in messages if m["method"] == "Network.requestWillBeSent"]


def open_page(browser, url: str, shot: str | None = None) -> dict:
    """Load a page and wait until it has settled; return its console errors and the URLs it requested."""
    browser.get_log("browser")  # drop what earlier pages left in the logs
    browser.get_log("performance")
    browser.get(url)
    settled = browser.execute_async_script(SETTLED_JS)
    if shot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SHOTS / f"{shot}.png"))
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    return {"settled": settled, "errors": errors, "requests": requested_urls(browser)}


@pytest.fixture(scope="module")
def show(site, browser, visit):
    """show(page): make the browser show this page, for a test that works in its DOM (recorded by visit first)."""

    def show(page: str) -> None:
        visit(page)
        if browser.current_url != site["base"] + page:
            open_page(browser, site["base"] + page)

    return show


@pytest.fixture(scope="module")
def visit(site, browser):
    """visit(page): open one page of the site (once per module) and record what the tests look at."""

    @functools.cache
    def visit(page: str) -> dict:
        record = open_page(browser, site["base"] + page, page.removesuffix(".html").replace("/", "-"))
        record |= browser.execute_script(PROSE_JS) if page != "search.html" else {}
        record["images"] = browser.execute_script(IMAGES_JS)
        record["nav"] = browser.execute_script(NAV_LINKS_JS)
        return record

    return visit


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_offline_without_errors(site, visit, page):
    record = visit(page)
    assert record["settled"] is True, record["settled"]
    assert record["errors"] == [], record["errors"]
    # Only requests that go out on the network count (data:, blob: and the browser's own chrome: pages do not).
    network = [url for url in record["requests"] if urllib.parse.urlsplit(url).scheme in NETWORK_SCHEMES]
    elsewhere = [
        url for url in network if urllib.parse.urlsplit(url).netloc != urllib.parse.urlsplit(site["base"]).netloc
    ]
    assert elsewhere == [], f"{page} requested {elsewhere[0]}"
    assert network, f"{page}: no request was recorded at all (is the performance log on?)"


def has_math(page: str) -> bool:
    """Whether the page's source writes any formula: TeX in a markdown cell, or a docstring's math directive."""
    if page == "api.html":
        from tools.build_site import API_MODULES  # the modules the page documents

        files = [ROOT / "mha_tutorial" / (name.replace(".", "/") + ".py") for name in API_MODULES]
        return any(".. math::" in f.read_text() for f in files if f.exists())
    if page == "docs/teaching.html":
        return "$" in (ROOT / "docs" / "teaching.md").read_text()
    cells = json.loads((ROOT / page.replace(".html", ".ipynb")).read_text())["cells"]
    return any("$" in "".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


@pytest.mark.parametrize("page", [*NOTEBOOK_PAGES, "docs/teaching.html", "api.html"])
def test_math_is_typeset(visit, page):
    record = visit(page)
    raw = RAW_TEX.search(record["text"])
    assert raw is None, f"TeX left untypeset on {page}: ...{record['text'][max(raw.start() - 60, 0) : raw.end() + 20]}"
    assert record["typeset"] > 0 if has_math(page) else record["typeset"] == 0, f"{page}: {record['typeset']} formulas"


@pytest.mark.parametrize("page", NOTEBOOK_PAGES)
def test_every_figure_is_drawn(visit, page):
    cells = json.loads((ROOT / page.replace(".html", ".ipynb")).read_text())["cells"]
    figures = sum("image/png" in out.get("data", {}) for cell in cells for out in cell.get("outputs", []))
    images = visit(page)["images"]
    assert len(images) == figures, f"{page}: {figures} figures in the notebook, {len(images)} images on the page"
    for img in images:
        assert img["width"] > 50 and img["height"] > 50, img
        assert img["distinct"] > 1, f"blank image on {page}: {img}"


@pytest.mark.parametrize("page", PAGES)
def test_every_navigation_link_leads_to_a_page_of_the_site(site, visit, page):
    nav = visit(page)["nav"]
    assert nav, f"{page} has no navigation"
    for link in nav:
        url = urllib.parse.urlsplit(link["href"])
        assert link["href"].startswith(site["base"]), link
        target = site["out"] / urllib.parse.unquote(url.path).lstrip("/")
        assert target.is_file(), f"{page}: {link['text']!r} leads to {link['href']}, which is not there"


def test_the_side_navigation_and_prev_next_follow_the_series(site, visit):
    nav = visit("index.html")["nav"]
    sidebar = [link["href"].removeprefix(site["base"]) for link in nav if link["where"] == "sidebar"]
    assert [p for p in sidebar if p.startswith("notebooks/")] == NOTEBOOK_PAGES
    assert {"docs/teaching.html", "api.html"} <= set(sidebar)
    befores, afters = ["index.html", *NOTEBOOK_PAGES[:-1]], [*NOTEBOOK_PAGES[1:], "docs/teaching.html"]
    for before, page, after in zip(befores, NOTEBOOK_PAGES, afters, strict=True):
        nav = visit(page)["nav"]
        arrows = {link["cls"]: link["href"].removeprefix(site["base"]) for link in nav if link["where"] == "prev-next"}
        assert (arrows.get("left-prev"), arrows.get("right-next")) == (before, after), (page, arrows)


def test_the_index_is_the_readme_series_table(site, browser, show):
    show("index.html")
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "article table a")]
    listed = [link.removeprefix(site["base"]) for link in links[: len(LESSON_PAGES)]]
    assert listed == LESSON_PAGES, f"the README's series table must list every notebook in order; it has {listed}"
    headers = [th.text for th in browser.find_elements("css selector", "article table th")]
    # Built from the committed notebooks: no timings.json, so no time to run (see test_index_shows_timings).
    assert not any("time" in h.lower() for h in headers), headers
    summaries = [td.text for td in browser.find_elements("css selector", "article table tr td:nth-child(3)")]
    assert all(len(text) > 20 for text in summaries[: len(LESSON_PAGES)]), summaries


def test_a_lesson_shows_no_solution_and_links_to_its_companion(site, browser, show):
    lesson = next(p for p in LESSON_PAGES if "/01_" in p)
    show(lesson)
    assert browser.find_elements("css selector", "article .tag_exercise"), "the lesson's stubs are there"
    assert not browser.find_elements("css selector", "article .tag_solution"), "a solution on a lesson's page"
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "article a[href]")]
    target = site["base"] + "notebooks/solutions/01_solutions.html"
    assert target in links, f"{lesson} does not link to its companion: {links[-5:]}"
    show("notebooks/solutions/01_solutions.html")
    solutions = browser.find_elements("css selector", "article .tag_solution")
    assert len(solutions) == 3, "notebook 01 has three exercises, its companion three solutions"
    for cell in solutions:
        code = cell.find_element("css selector", "pre")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", code)
        assert code.is_displayed() and "def " in code.text, "the companion shows its solutions, nothing folded"
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "article a[href]")]
    assert site["base"] + lesson in links, "the companion links back to its lesson"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "solutions-companion.png"))


@pytest.mark.parametrize("page", LESSON_PAGES)
def test_no_lesson_page_holds_solution_code(site, page):
    html = (site["out"] / page).read_text(encoding="utf-8")
    assert "tag_solution" not in html
    path = ROOT / page.replace(".html", ".ipynb")
    if companion(path).exists():
        assert f'href="solutions/{companion(path).stem}.html"' in html, f"{page} does not link to its companion"
        text = html_module.unescape(re.sub(r"<[^>]+>", "", html))
        lesson = "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
        for cell in json.loads(companion(path).read_text())["cells"]:
            if "solution" in cell["metadata"].get("tags", []):
                # Each line of a solution that the lesson does not write itself (a buggy version to fix shares a
                # few), long enough to be specific: none is on the lesson's page.
                lines = [line.strip() for line in "".join(cell["source"]).split("\n")[1:]]
                own = [line for line in lines if len(line) > 20 and line not in lesson]
                assert own, f"{page}: nothing specific to look for in a solution"
                shown = [line for line in own if line in text]
                assert not shown, f"{page} shows its solution: {shown}"


def test_search_finds_a_function(site, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    record = open_page(browser, site["base"] + "search.html?q=transpose_qkv")
    results = WebDriverWait(browser, 30).until(
        lambda b: b.find_elements("css selector", "#search-results ul.search li")
    )
    browser.save_screenshot(str(SHOTS / "search-results.png"))
    assert record["errors"] == [], record["errors"]
    hrefs = [li.find_element("css selector", "a").get_attribute("href") for li in results]
    assert any("api.html" in h for h in hrefs) and any("03_splitting_heads" in h for h in hrefs), hrefs


def test_api_page_documents_the_package(browser, show):
    show("api.html")
    signature = browser.find_element("css selector", "dt[id='mha_tutorial.core.mha.MultiHeadAttention']")
    assert "MultiHeadAttention" in signature.text
    docstring = signature.find_element("xpath", "following-sibling::dd").text
    assert "Multi-head attention with per-head weights" in docstring
    text = browser.find_element("css selector", "article").text
    for name in ("masked_softmax", "transpose_qkv", "SeqFirstMultiHeadAttention", "prune_attention_heads"):
        assert name in text


# Without a browser: the pieces the build assembles its source tree from.


def test_index_shows_timings_only_from_the_run_steps_file(tmp_path):
    table = (
        "| # | Notebook | What it teaches |\n|---|----------|-----------------|\n"
        "| 01 | [A](notebooks/01_a.ipynb) | one |\n| 01a | [B](notebooks/01a_b.ipynb) | two |\n"
    )
    assert read_timings(tmp_path) == {}
    assert with_timings(table, {}) == table
    (tmp_path / "timings.json").write_text(json.dumps({"01_a.ipynb": 12.4}))
    rows = with_timings(table, read_timings(tmp_path)).splitlines()
    assert rows[0].endswith("| Time to run |") and rows[1].endswith(":|")
    assert rows[2].endswith("| 12 s |") and rows[3].endswith("| – |")


def test_each_companion_comes_right_after_its_lesson():
    found = pages(ROOT / "notebooks")
    lessons = series_notebooks()
    assert [p for p in found if p in lessons] == lessons
    assert COMPANION_PAGES and len(found) == len(lessons) + len(COMPANION_PAGES)
    for i, path in enumerate(found):
        if path not in lessons:
            assert companion(found[i - 1]) == path, path


def test_links_to_files_outside_the_site_become_text(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("")
    page = "[kept](here.md), [web](https://example.org), [anchor](#top), [the notes](gpu/README.md), [gpu/](gpu/x.md)"
    assert unlink_missing(page, tmp_path / "docs" / "page.md", tmp_path) == (
        "[kept](here.md), [web](https://example.org), [anchor](#top), the notes (`docs/gpu/README.md` in the"
        " repository), gpu/"
    )


def test_the_runner_executes_in_place_and_records_wall_times(tmp_path):
    import nbformat

    from tools.run_notebooks import main

    path = tmp_path / "01_tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]), path)
    assert main([str(path)]) == 0
    assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"] == "42\n"
    timings = read_timings(tmp_path)
    assert list(timings) == ["01_tiny.ipynb"] and 0 < timings["01_tiny.ipynb"] < 120
