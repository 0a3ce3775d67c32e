"""The rendered site works offline in a real browser (headless Chromium).

The site is rendered from the notebooks' committed outputs (strict nbval checks
elsewhere that those outputs are what the code produces), served on localhost,
and opened in Debian's Chromium through Selenium and chromedriver. One
screenshot per page is kept under build/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="headless Chromium not found: install Debian's 'chromium' and 'chromium-driver' (.ci/run does)",
)

# In the page: every <img>, its natural size and whether its pixels vary (a blank image has one colour).
IMAGES_JS = """
return Array.from(document.images).map(img => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d');
  ctx.drawImage(img, 0, 0);
  let distinct = 0;
  if (c.width && c.height) {
    const d = ctx.getImageData(0, 0, c.width, c.height).data, first = d.slice(0, 4).join();
    const seen = new Set([first]);
    for (let i = 0; i < d.length && seen.size < 8; i += 4 * 97) seen.add(d.slice(i, i + 4).join());
    distinct = seen.size;
  }
  return {src: img.src.slice(0, 40), width: img.naturalWidth, height: img.naturalHeight, distinct: distinct};
});
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from tools.site import build

    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    out = tmp_path_factory.mktemp("site")
    build(notebooks, out)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def open_page(browser, url: str, name: str):
    """Load a page, save a screenshot; return the console errors."""
    browser.get_log("browser")  # drop messages of earlier pages
    browser.get(url)
    shots = ROOT / "build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shots / f"{name}.png"))
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_index_lists_every_notebook_in_order(site, browser):
    out, base = site
    errors = open_page(browser, f"{base}/index.html", "index")
    assert errors == [], errors
    links = [a.get_attribute("href").rsplit("/", 1)[-1] for a in browser.find_elements("css selector", "tbody a")]
    expected = [p.with_suffix(".html").name for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    assert links == expected
    cells = [td.text for td in browser.find_elements("css selector", "tbody td:nth-child(4)")]
    # Committed notebooks carry no timing metadata (hygiene strips it), so this build has no run times;
    # `make run` renders freshly executed copies, whose times test_run_seconds_reads_nbclient_timing covers.
    assert cells == ["–"] * len(expected), cells
    summaries = [td.text for td in browser.find_elements("css selector", "tbody td:nth-child(3)")]
    assert all(len(text) > 20 for text in summaries), summaries  # and its one-line summary from the README


def test_api_page_documents_the_package(site, browser):
    out, base = site
    assert open_page(browser, f"{base}/api.html", "api") == []
    text = browser.find_element("css selector", "body").text
    for name in ("masked_softmax", "transpose_qkv", "MultiHeadAttention", "SeqFirstMultiHeadAttention"):
        assert name in text


def notebook_pages():
    return [p.with_suffix(".html").name for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]


@pytest.mark.parametrize("page", notebook_pages())
def test_notebook_page_renders_offline(site, browser, page):
    out, base = site
    html = (out / page).read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "a page must not load anything from the network"
    errors = open_page(browser, f"{base}/{page}", page.removesuffix(".html"))
    assert errors == [], errors
    images = browser.execute_script(IMAGES_JS)
    assert images, "every notebook of the series draws at least one figure"
    for img in images:
        assert img["width"] > 50 and img["height"] > 50, img
        assert img["distinct"] > 1, f"blank image: {img}"
    source = (ROOT / "notebooks" / page.replace(".html", ".ipynb")).read_text()
    if "$$" in source:  # the TeX was typeset as MathML and the browser laid it out
        heights = browser.execute_script(
            "return Array.from(document.querySelectorAll('math')).map(m => m.getBoundingClientRect().height)"
        )
        assert heights and min(heights) > 0, heights


def test_run_seconds_reads_nbclient_timing():
    import nbformat

    from tools.site import run_seconds

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1"), nbformat.v4.new_code_cell("2")])
    nb.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-11-23T05:00:00.000000Z"}
    nb.cells[1].metadata["execution"] = {"shell.execute_reply": "2026-11-23T05:00:12.500000Z"}
    assert run_seconds(nb) == 12.5
    assert run_seconds(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])) is None
