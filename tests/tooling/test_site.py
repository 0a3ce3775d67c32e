"""The Sphinx site (make run, make site) builds in under a minute and works offline in a real browser.

The site is built once per module from the notebooks' committed outputs (checked by strict nbval elsewhere), with no
repository address, served from localhost and opened in Debian's Chromium (tests/tooling/sitekit.py). Each page is
visited once: its console errors, every request it makes, its math, figures and links are recorded, and the tests
below judge them (screenshots: build/screenshots/, and of the parts a reader uses, build/site-shots/). The launch
buttons and repository link, which need an address, are checked on a one-notebook site built in a few seconds.
Without Chromium the browser tests are skipped, except in CI (CI set), where .ci/run installs it: there they fail.
"""

from __future__ import annotations

import functools
import html as html_module
import json
import re
import time
import urllib.parse

import pytest

from tests.tooling.sitekit import (
    IMAGES_JS,
    NAV_LINKS_JS,
    OVERLAP_JS,
    PROSE_JS,
    RAW_TEX,
    ROOT,
    SCROLL_JS,
    SHOTS,
    WIDEST_JS,
    addresses_shown,
    assert_excerpts,
    chromium,
    has_math,
    mathjax_shipped,
    open_page,
    save_shot,
    search,
    serve,
    small_site,
)
from tools.build_site import badges_as_links, build, pages, read_timings, readme_section, unlink_missing, with_timings
from tools.series import companion, series_notebooks
from tools.site.header_links import header_buttons
from tools.site.tex_text import tex_to_text

LESSON_PAGES = [f"notebooks/{p.stem}.html" for p in series_notebooks()]
# Every lesson, each followed by its companion of worked solutions where it has one.
NOTEBOOK_PAGES = [
    "notebooks/" + p.relative_to(ROOT / "notebooks").with_suffix(".html").as_posix() for p in pages(ROOT / "notebooks")
]
COMPANION_PAGES = [page for page in NOTEBOOK_PAGES if page not in LESSON_PAGES]
PAGES = ["index.html", *NOTEBOOK_PAGES, "docs/teaching.html", "api.html", "genindex.html", "search.html"]
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}
KINDS = ("launch-binder-button", "launch-colab-button", "source-repository-button")  # tools/site/header_links.py


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built from the committed notebooks, with no repository address, into a temporary folder and
    served on localhost."""
    work = tmp_path_factory.mktemp("site")
    out = work / "html"
    seconds = build(ROOT / "notebooks", out, work / "work", repository_url="")
    print(f"site built in {seconds:.1f} s")
    server, base = serve(out)
    yield {"out": out, "base": base, "seconds": seconds}
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


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
        # A click opens the full-size image; the figure spans the column and the contents' margin beside it, and
        # is scaled down only where it is wider than that, never up.
        assert img["href"] == img["src"], f"{page}: a figure that does not link to its full-size image: {img}"
        assert img["room"] >= img["column"] + 200, f"{page}: a figure kept inside the text column: {img}"
        assert min(img["width"], img["room"]) - 1 <= img["shown"] <= img["width"] + 0.5, f"{page}: {img}"


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
    heading = browser.find_element("css selector", "article section#quick-start h2")  # then the README's Quick start
    code = browser.find_element("css selector", "article section#quick-start pre").text
    assert heading.text.startswith("Quick start") and all(f"make {c}" in code for c in ("lab", "run", "test")), code
    browser.execute_script("arguments[0].scrollIntoView()", heading)
    save_shot(browser, "landing-quick-start")


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

    def tagged(path, tag):
        return sum(tag in c.get("metadata", {}).get("tags", []) for c in json.loads(path.read_text())["cells"])

    exercises = tagged(next((ROOT / "notebooks").glob("01_*.ipynb")), "exercise")
    answers = tagged(ROOT / "notebooks" / "solutions" / "01_solutions.ipynb", "solution")
    assert exercises > 0 and len(solutions) == answers == exercises, (
        f"notebook 01 has {exercises} exercises, its companion {answers} solutions, its page shows {len(solutions)}"
    )
    for cell in solutions:
        code = cell.find_element("css selector", "pre")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", code)
        assert code.is_displayed() and "def " in code.text, "the companion shows its solutions, nothing folded"
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "article a[href]")]
    assert site["base"] + lesson in links, "the companion links back to its lesson"
    save_shot(browser, "solutions-companion", SHOTS)


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


def test_search_finds_a_function_and_shows_excerpts(site, browser):
    results, errors = search(browser, site["base"] + "search.html?q=transpose_qkv", "search-served")
    assert errors == [], errors
    hrefs = [r["href"] for r in results]
    assert any("api.html" in h for h in hrefs) and any("03_splitting_heads" in h for h in hrefs), hrefs
    assert_excerpts(results)


def test_search_shows_excerpts_when_the_site_is_opened_as_a_file(site, browser):
    results, errors = search(browser, (site["out"] / "search.html").as_uri() + "?q=divide", "search-as-a-file")
    assert errors == [], errors
    assert_excerpts(results)
    assert any("√" in r["excerpt"] for r in results), [r["excerpt"] for r in results]


def test_one_search_box_per_page(browser, show):
    show(LESSON_PAGES[0])
    fields = browser.find_elements("css selector", ".search-button-field, .search-button__button, #searchbox input")
    assert sum(f.is_displayed() for f in fields) == 1, "the page shows more than one search box"


def test_a_notebook_page_offers_its_ipynb_for_download(site, browser, show):
    show(page := LESSON_PAGES[0])
    browser.find_element("css selector", ".dropdown-download-buttons button").click()
    link = browser.find_element("css selector", ".dropdown-download-buttons a[href$='.ipynb']")
    assert link.is_displayed(), "the download menu does not show the .ipynb"
    save_shot(browser, "download-menu")
    target = site["out"] / urllib.parse.unquote(link.get_attribute("href").removeprefix(site["base"]))
    assert target.is_file(), f"the download link leads to {target}, which the site does not have"
    shipped, committed = (json.loads(path.read_text())["cells"] for path in (target, ROOT / f"{page[:-5]}.ipynb"))
    assert shipped == committed, "the downloadable notebook is not the one the page shows"


@pytest.mark.parametrize("part", ["pre", "mjx-container[display='true']"])
def test_wide_code_and_formulas_scroll_and_show_it(browser, show, part):
    show("notebooks/04_multi_head_attention.html")
    widest = browser.execute_script(WIDEST_JS, f"article {part}")
    assert widest, f"no {part} wider than the column on 04 to look at"
    time.sleep(0.6)  # for the contents to fold, if a figure came into view
    save_shot(browser, name := "wide-code" if part == "pre" else "wide-formula")
    assert widest["overflow"] in ("auto", "scroll") and widest["shadow"], f"nothing shows that {part} scrolls: {widest}"
    assert browser.execute_script(SCROLL_JS) > 0, f"{part} does not scroll: {widest}"
    save_shot(browser, f"{name}-scrolled")


def test_a_figure_opens_at_full_size(site, browser, show):
    show("notebooks/09_pretrained_heads.html")
    link = max(browser.find_elements("css selector", "article a.figure-link"), key=lambda a: a.size["width"])
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    time.sleep(0.6)  # the page's contents fold away while a figure is in view (a 0.4 s transition)
    save_shot(browser, "figure-in-page")
    assert not browser.execute_script(OVERLAP_JS, link), "the page's contents cover part of a figure"
    figure = browser.execute_script("const i = arguments[0].querySelector('img'); return [i.src, i.naturalWidth]", link)
    link.click()
    opened = browser.execute_script("return [location.href, document.images[0].naturalWidth]")
    save_shot(browser, "figure-full-size")
    assert opened == figure, f"the figure {figure} opens {opened}"


def test_mathjax_ships_only_what_the_pages_load(site, visit):
    base = site["base"] + "_static/mathjax/"
    requests = [url for page in PAGES for url in visit(page)["requests"]]
    loaded = {url.removeprefix(base).split("?")[0] for url in requests if url.startswith(base)}
    assert "tex-chtml.js" in loaded, "no page loaded MathJax"
    shipped, fonts, size = mathjax_shipped(site["out"] / "_static" / "mathjax")
    assert loaded <= shipped, f"pages load MathJax files the site lacks: {loaded - shipped}"
    assert shipped - loaded <= fonts, f"MathJax files that no page loads: {sorted(shipped - loaded - fonts)}"
    assert size < 3e6, f"_static/mathjax holds {size / 1e6:.1f} MB"
    assert not list(site["out"].rglob("*.map")), "source maps shipped"


def test_api_page_documents_the_package(browser, show):
    show("api.html")
    signature = browser.find_element("css selector", "dt[id='mha_tutorial.core.mha.MultiHeadAttention']")
    assert "MultiHeadAttention" in signature.text
    docstring = signature.find_element("xpath", "following-sibling::dd").text
    assert "Multi-head attention with per-head weights" in docstring
    text = browser.find_element("css selector", "article").text
    for name in ("masked_softmax", "transpose_qkv", "SeqFirstMultiHeadAttention", "prune_attention_heads"):
        assert name in text


def test_no_launch_button_or_repository_link_without_an_address(site):
    """Built with no repository address (as pyproject has none yet): nothing anywhere shows one."""
    shown = {path.name: addresses_shown(path.read_text(encoding="utf-8")) for path in site["out"].rglob("*.html")}
    assert not {name: found for name, found in shown.items() if found}


def test_launch_buttons_and_repository_link_come_from_the_address(tmp_path, browser):
    """A one-notebook site built with an address: its lesson's Binder, Colab and repository links."""
    out = small_site(tmp_path, "https://github.com/example-owner/mha-from-scratch")
    page = (out / "notebooks" / "01_tiny.html").read_text(encoding="utf-8")
    hrefs = {kind: re.findall(rf'href="([^"]+)"[^>]*\s+class="[^"]*btn-{kind}', page) for kind in KINDS}
    assert hrefs == {
        "launch-binder-button": ["https://mybinder.org/v2/gh/example-owner/mha-from-scratch/HEAD?labpath=notebooks/01_tiny.ipynb"],
        "launch-colab-button": ["https://colab.research.google.com/github/example-owner/mha-from-scratch/blob/main/notebooks/01_tiny.ipynb"],
        "source-repository-button": ["https://github.com/example-owner/mha-from-scratch"],
    }  # fmt: skip
    index = (out / "index.html").read_text(encoding="utf-8")  # not a notebook: the repository link alone
    assert "btn-source-repository-button" in index and "launch-buttons" not in index
    browser.get((out / "notebooks" / "01_tiny.html").as_uri())
    browser.find_element("css selector", ".dropdown-launch-buttons button").click()
    save_shot(browser, "launch-buttons")
    shown = browser.find_elements("css selector", ".dropdown-launch-buttons a, a.btn-source-repository-button")
    assert [a.get_attribute("href") for a in shown if a.is_displayed()] == [h for k in KINDS for h in hrefs[k]]


def test_off_github_a_page_gets_the_repository_link_alone():
    assert header_buttons(None, "notebooks/01_a.ipynb") == header_buttons("", "notebooks/01_a.ipynb") == []
    buttons = header_buttons(url := "https://codeberg.org/someone/mha", "notebooks/01_a.ipynb")  # not GitHub
    assert [(b["label"], b["url"]) for b in buttons] == [("source-repository-button", url)]


# Without a browser: the pieces the build assembles its source tree from.


def test_the_landing_page_takes_the_readme_sections_and_turns_badges_into_links():
    readme = "# T\n\nIntro.\n\n## The series\n\n| a |\n\n## Other\n\nx\n\n## Quick start\n\n```bash\nmake lab\n```\n"
    assert readme_section(readme, "The series", from_title=True) == "# T\n\nIntro.\n\n## The series\n\n| a |\n"
    assert readme_section(readme, "Quick start") == "## Quick start\n\n```bash\nmake lab\n```\n"
    badges = "[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://c.example/x) ![b](//b.example/y.svg)"
    assert badges_as_links(badges) == "[Open in Colab](https://c.example/x) b"
    assert badges_as_links("![local](figure.png)") == "![local](figure.png)"


def test_formulas_read_as_text_in_search_excerpts():
    assert tex_to_text(r"\(\sqrt{d}\)") == "√d"
    assert tex_to_text(r"\[\mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d}}\right)V\]") == "softmax(QKᵀ/√d)V"
    assert tex_to_text(r"\(W_h^Q \in \mathbb{R}^{D\times d}\)") == "W_h^Q ∈ ℝ^(D × d)"
    assert tex_to_text(r"\(\operatorname{diag}(p) - pp^\top, \ \alpha\Delta\)") == "diag(p) - ppᵀ, αΔ"


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
