"""Text from a trace or a file name is shown as text, and secrets are redacted, on every page, in a real Chromium.

A hostile trace names its operators with a Markdown link and image, an autolink, raw HTML, ``__dunder__`` underscores,
a 10 kB name and a Hugging Face token, all pointing at a local HTTP server started by the test (the bait); its file
name holds Markdown, HTML and a token too. On every page: the bait gets no request, no link or image to it exists,
nothing the trace wrote becomes bold or a script, the main area does not overflow 1024 px, and the tokens appear
nowhere in the page (nor in the grid's own CSV export, nor in the Export page's downloads)."""

from __future__ import annotations

import json
import os

import pytest
from browserlib import SAMPLES, TITLES, Bait, choose, go, no_errors, serve_app, settled
from tracebuilder import TraceBuilder

pytestmark = [pytest.mark.browser, pytest.mark.app]

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
FILE_TOKEN = "hf_FileNameTokenAbCdEfGhIjKl0123"
FILE_NAME = f"run`x` [f](y) <img src=y> <u>f<u> __f__ {FILE_TOKEN}.json"  # no "/" in a file name
BROKEN_NAME = "broken [g](z) <u>g<u> __g__.json"
#: its loader stall's advice names the Dataset's __getitem__
LOADER = next((SAMPLES / "cpu" / "respawn_workers").glob("*.pt.trace.json.gz"))
#: what the page may never hold as an element's whole text (the trace's **bold**, __dunder__ and markup made bold)
MARKUP_WORDS = ["bold", "getitem", "f", "g", "x"]


def hostile_names(bait: str) -> dict[str, str]:
    return {
        "link": f"cudaLink [click me]({bait}/link) ![pixel]({bait}/pixel.gif) autolink {bait}/auto.gif www.example.com",
        "html": f'cudaHtml <img src="{bait}/html.gif"> <b>bold</b> __getitem__ <script>document.title="pwned"</script>',
        "long": "cudaLong_" + "x" * 10_240,
        "secret": f"cudaSecret {TOKEN}",
    }


def hostile_trace(folder, bait: str):
    """Three 1 ms steps; in each, the four hostile ops nested in one another (so every thread row of the timeline
    holds one), and an allocation inside the innermost one. The trace lists a GPU but records no GPU activity: the
    gpu_activity_missing finding names the first three ops in its title and evidence."""
    names = hostile_names(bait)
    b = TraceBuilder(device_properties=[{"id": 0, "name": f"GPU <img src=\"{bait}/gpu.gif\"> __gpu__",
                                         "totalGlobalMem": 80 * 2**30, "computeMajor": 9, "computeMinor": 0}])
    allocated = 0
    for s in range(3):
        t = s * 1000
        b.step(s + 1, t, 1000)
        for depth, key in enumerate(("link", "html", "long", "secret")):
            b.op(names[key], t + 10 + 10 * depth, 900 - 20 * depth)
        allocated += 1 << 20
        b.memory(t + 500, 1 << 20, allocated=allocated, reserved=8 << 20)
    return b.write(folder / FILE_NAME)


@pytest.fixture(scope="module")
def bait():
    server = Bait()
    yield server
    server.close()


@pytest.fixture(scope="module")
def hostile_url(bait, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    trace = hostile_trace(folder, bait.url)
    broken = folder / BROKEN_NAME
    broken.write_text("{")
    yield from serve_app(str(trace), str(LOADER), str(broken), env=dict(os.environ))


#: in the page: links or images to the bait, elements whose whole text is a word the trace wrote as markup, scripts
#: the trace wrote, and whether the main area is wider than the window
_CHECK = """([port, words]) => {
  const main = document.querySelector('[data-testid=stMain]');
  const all = [...document.querySelectorAll('[data-testid=stMain] *, [data-testid=stSidebar] *')];
  const bad = [];
  for (const e of all) {
    const tag = e.tagName.toLowerCase();
    for (const attr of ['src', 'href', 'srcset', 'data', 'action', 'poster']) {
      const v = e.getAttribute && e.getAttribute(attr);
      if (v && v.includes(port)) bad.push(tag + ' ' + attr + '=' + v);
    }
    if (['b', 'strong', 'em', 'i', 'u', 'del', 'code', 'a', 'img', 'h1', 'h2', 'h3', 'h4', 'li'].includes(tag)
        && words.includes(e.textContent.trim())) bad.push(tag + ' holds ' + e.textContent.trim());
    if (tag === 'script') bad.push('script ' + e.textContent.slice(0, 80));
  }
  if (document.title === 'pwned') bad.push('the trace set the title');
  if (main.scrollWidth > main.clientWidth + 1)
    bad.push('main is ' + main.scrollWidth + ' px wide in ' + main.clientWidth);
  return bad;
}"""


def _open(page, url: str, label: str) -> None:
    page.goto(url)
    settled(page)
    choose(page, "Trace", label)
    page.get_by_text(f"{label} ·").first.wait_for(timeout=120_000)
    settled(page)


def test_trace_text_is_text_on_every_page_at_1024_px(hostile_url, bait, browser):
    context = browser.new_context(viewport={"width": 1024, "height": 900})
    page = context.new_page()
    port = bait.url.rsplit(":", 1)[1]
    label = next(p for p in [FILE_NAME] if p)  # the hostile file (the first given path: opened by default)
    page.goto(hostile_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    seen: dict[str, list[str]] = {}
    for name, title in TITLES.items():
        go(page, title)
        for summary in page.locator("[data-testid=stExpander] summary").all():  # evidence, shown as a user opens it
            summary.click()
        settled(page)
        bad = page.evaluate(_CHECK, [port, MARKUP_WORDS])
        if bad:
            seen[name] = bad
    main = page.locator("[data-testid=stMain]")
    go(page, "Overview")
    shown = main.inner_text()
    context.close()
    assert not bait.requests, bait.requests
    assert not seen, seen
    names = hostile_names(bait.url)
    # the finding's title names the ops as written (collapsed whitespace aside), the file name too
    assert f"[click me]({bait.url}/link) ![pixel]({bait.url}/pixel.gif)" in shown
    assert "<b>bold</b> __getitem__ <script>" in shown
    assert label.split(" hf_")[0] in shown
    assert names["long"][:200] in shown and names["long"] not in shown  # 10 kB: shortened in prose, and said so
    assert "10,249 characters" in shown


def test_the_apps_own_advice_renders_as_intended(hostile_url, page):
    """The loader stall's advice names the Dataset's __getitem__: shown with its underscores, not as bold 'getitem'."""
    _open(page, hostile_url, LOADER.name)
    main = page.locator("[data-testid=stMain]")
    assert "Dataset's __getitem__ cheaper" in main.inner_text()
    assert page.evaluate(_CHECK, ["no-port", ["getitem"]]) == []
    # the app's own emphasis still renders: the severity and the 'What to do' label are bold
    assert main.locator("strong", has_text="What to do:").count() >= 1


def test_a_broken_files_error_names_it_as_text(hostile_url, page):
    page.goto(hostile_url)
    settled(page)
    choose(page, "Trace", BROKEN_NAME.split(" ")[0])
    page.locator("[data-testid=stAlertContentError]").first.wait_for(timeout=120_000)
    errors = no_errors(page)
    assert errors and any(BROKEN_NAME in e for e in errors), errors
    assert page.evaluate(_CHECK, ["no-port", MARKUP_WORDS]) == []


def test_no_page_shows_a_secret_nor_exports_one(hostile_url, browser, tmp_path):
    """Item 2: tables, chart labels, titles and the grid's own CSV button are redacted, like the exports."""
    context = browser.new_context(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
    # the grid's CSV button writes through the File System Access API: a stand-in keeps what it writes
    context.add_init_script("""window.showSaveFilePicker = async () => ({ createWritable: async () => {
      const parts = []; const dec = new TextDecoder();
      return { write: async (d) => { parts.push(typeof d === 'string' ? d : dec.decode(d)); },
               close: async () => { window.__csv = (window.__csv || []).concat([parts.join('')]); } }; } });""")
    page = context.new_page()
    page.goto(hostile_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    leaks: dict[str, str] = {}
    for name, title in TITLES.items():
        go(page, title)
        html = page.content()
        for token in (TOKEN, FILE_TOKEN):
            if token in html:
                leaks[name] = token
    # the Operators grid: its own download button exports what it shows
    go(page, "Operators & kernels")
    grid = page.locator("[data-testid=stDataFrame]").first
    grid.hover()
    page.locator("[data-testid=stElementToolbarButton]").filter(
        has=page.locator("[aria-label='Download as CSV'], [title='Download as CSV']")).first.click()
    page.wait_for_function("() => window.__csv && window.__csv.length > 0", timeout=30_000)
    csv = page.evaluate("() => window.__csv[0]")
    # the Export page's downloads
    go(page, "Export")
    downloads = {}
    for label in ("JSON report", "CSV"):
        with page.expect_download(timeout=60_000) as got:
            page.get_by_role("button", name=label, exact=True).click()
        downloads[label] = open(got.value.path(), encoding="utf-8").read()
    context.close()
    assert not leaks, leaks
    assert "cudaSecret [redacted]" in csv and TOKEN not in csv
    for label, text in downloads.items():
        assert TOKEN not in text and FILE_TOKEN not in text, label
    assert "[redacted]" in downloads["JSON report"]
    json.loads(downloads["JSON report"])


def test_timeline_tooltips_show_trace_text_as_text(hostile_url, bait, page):
    """Every span of the hostile trace's timeline, hovered: its tooltip holds the name as text (no image, no bold)."""
    page.goto(f"{hostile_url}/timeline")
    # the spans drawn (a zero-size path, an empty block, is drawn for nothing and is never visible)
    marks = page.locator("[data-testid=stVegaLiteChart] svg .mark-rect path >> visible=true")
    marks.first.wait_for(timeout=120_000)
    settled(page)
    tooltip = page.locator("#vg-tooltip-element")
    seen = []
    for i in range(marks.count()):
        box = marks.nth(i).bounding_box()
        if not box or not box["width"] or not box["height"]:
            continue
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=2)
        tooltip.wait_for(state="visible", timeout=10_000)
        seen.append(tooltip.inner_html())
    shown = " ".join(seen)
    assert "<img" not in shown and "<b>" not in shown and "<script" not in shown
    assert "&lt;b&gt;bold&lt;/b&gt;" in shown and "[click me]" in shown
    assert TOKEN not in shown and "cudaSecret [redacted]" in shown
    assert not bait.requests
