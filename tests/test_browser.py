"""The app in a real headless Chromium, as a user clicks through it: upload a loader-bound trace and see the stall;
compare two given traces; a 4-rank upload whose Overview and Distributed view name the straggler; the timeline of
a 95 MB event-dense trace showing kernels within 5 s; Open in Perfetto handing the trace over by Perfetto's
documented handshake (to a stand-in Perfetto page: the machine has no internet); no error element on any page."""

from __future__ import annotations

import gzip
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
TRACE = next((SAMPLES / "cpu" / "loader_bound").glob("*.pt.trace.json.gz"))
BEFORE = SAMPLES / "pairs" / "v100_resnet50_num_workers_0_run2.json.gz"
AFTER = SAMPLES / "pairs" / "v100_resnet50_num_workers_4_run2.json.gz"
PAGES = ["overview", "steps", "streams", "copies", "memory", "operators", "telemetry", "timeline", "ranks", "distributed",
         "compare", "metadata", "export"]

#: a stand-in for ui.perfetto.dev: answers PING with PONG, then shows the size of the trace it was given
FAKE_PERFETTO = b"""<!doctype html><title>waiting</title><script>
window.addEventListener("message", (evt) => {
  if (evt.data === "PING") { evt.source.postMessage("PONG", "*"); return; }
  if (evt.data && evt.data.perfetto) {
    document.title = "got " + evt.data.perfetto.buffer.byteLength + " bytes: " + evt.data.perfetto.fileName;
  }
});
</script>"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fake_perfetto():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(FAKE_PERFETTO)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def dense_trace(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dense_trace import write_dense_trace

    path = tmp_path_factory.mktemp("dense") / "dense-95mb.json"
    size = write_dense_trace(path, steps=227)
    assert 90e6 < size < 100e6
    return path


def serve_app(*args: str, env: dict[str, str] | None = None):
    """Run ``kinetoscope app ARGS`` on a free port; yields its URL once healthy, stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kinetoscope", "app", "--port", str(port), "--headless", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the app did not start within 60 s")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def app_url(fake_perfetto, dense_trace):
    """The app on three given paths (the 95 MB trace first, so it is analysed once the page opens)."""
    yield from serve_app(str(dense_trace), str(BEFORE), str(AFTER),
                         env={**os.environ, "KINETOSCOPE_PERFETTO_URL": fake_perfetto})


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    yield context.new_page()
    context.close()


def choose(page, label: str, option: str, exact: bool = False) -> None:
    """Pick ``option`` in the selectbox labelled ``label``."""
    page.locator("[data-testid=stSelectbox]").filter(has_text=label).first.click()
    page.get_by_role("option", name=option, exact=exact).first.click()


def open_trace(page, app_url: str, trace: Path) -> None:
    """Open the app and pick one of its given traces in the sidebar, its analysis shown."""
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    choose(page, "Trace", trace.name)
    page.get_by_text(f"{trace.name} ·").first.wait_for(timeout=60_000)


#: each page's link title and the heading it draws first (in the main area)
HEADINGS = {"Overview": "Kinetoscope", "Step breakdown": "Step breakdown", "Streams": "CUDA streams", "Copies": "Copies",
            "Memory": "Memory", "Operators & kernels": "Operators and kernels", "Telemetry": "Telemetry",
            "Timeline": "Timeline", "Ranks": "Ranks", "Distributed": "Distributed", "Compare": "Compare",
            "Metadata": "Metadata", "Export": "Export"}
_SHOWN = """([heading]) => {
  const main = document.querySelector('[data-testid=stMain]') || document;
  const h = [...main.querySelectorAll('h1, h2')].some(e => e.innerText.startsWith(heading));
  return h && !document.querySelector('[data-testid=stStatusWidget]') && !main.querySelector('[data-stale=true]');
}"""


def go(page, title: str) -> None:
    """Click a page's link and wait until that page is drawn and its script has finished."""
    page.get_by_role("link", name=title, exact=True).click()
    page.wait_for_function(_SHOWN, arg=[HEADINGS[title]], timeout=60_000, polling=50)


def no_errors(page) -> list[str]:
    errors = page.locator("[data-testid=stException], [data-testid=stAlertContentError]")
    return [errors.nth(i).inner_text() for i in range(errors.count())]


def test_upload_a_loader_bound_trace_and_see_the_stall(app_url, page, tmp_path):
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
    page.locator("input[type=file]").set_input_files(str(TRACE))
    started = time.perf_counter()
    page.get_by_text("Data loading takes").first.wait_for(timeout=60_000)
    elapsed = time.perf_counter() - started
    # the analysis is labelled with the uploaded file's name (never a server path)
    assert page.get_by_text(TRACE.name).count() >= 1
    shot = Path(os.environ.get("KINETOSCOPE_SCREENSHOT", tmp_path / "upload.png"))
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000
    assert elapsed < 30


def test_compare_two_given_traces(app_url, page):
    open_trace(page, app_url, AFTER)
    page.get_by_role("link", name="Compare").click()
    choose(page, "Compare the current trace", BEFORE.name)
    page.get_by_text("Findings gone: predicted and measured").first.wait_for(timeout=60_000)
    # tables are drawn on a canvas (no text to read in the page): the headings say what is shown
    assert page.get_by_text(f"The current trace, {AFTER.name}").count() == 0  # a run was chosen
    assert not no_errors(page)


def test_a_four_rank_upload_names_rank_2_on_the_overview_and_the_distributed_view(app_url, page, tmp_path):
    from test_trust import straggler_job

    straggler_job(tmp_path / "job", slow=2, n=4)
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
    page.locator("input[type=file]").set_input_files(sorted(str(p) for p in (tmp_path / "job").glob("*.json")))
    page.get_by_text("headline numbers: rank 2 of 4").first.wait_for(timeout=60_000)
    assert page.get_by_text("Rank 2 is the straggler", exact=False).count() >= 1
    page.get_by_role("link", name="Distributed").click()
    straggler = page.locator("[data-testid=stMetric]").filter(has_text="Straggler")
    straggler.first.wait_for(timeout=30_000)
    assert "rank 2" in straggler.first.inner_text()
    assert "rank 2" in page.locator("[data-testid=stMetric]").filter(has_text="Most waited for").first.inner_text()
    assert not no_errors(page)
    # the GPU split chart draws a bar per rank (was: the four ranks squashed into one 10 px row)
    chart = page.locator("[data-testid=stVegaLiteChart]").first
    assert chart.bounding_box()["height"] >= 4 * 30


def test_the_timeline_of_a_95_mb_trace_shows_kernels_within_5_s(app_url, page, dense_trace):
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)  # the trace is loaded and analysed (cached)
    started = time.perf_counter()
    page.goto(f"{app_url}/timeline")  # opening the Timeline: a fresh page load, the session and the page's script
    caption = page.get_by_text("drawn one by one").first
    caption.wait_for(timeout=30_000)
    chart = page.locator("[data-testid=stVegaLiteChart]").first
    chart.locator("canvas, svg").first.wait_for(timeout=30_000)
    elapsed = time.perf_counter() - started
    assert elapsed < 5, f"{elapsed:.1f} s"
    assert "(400 kernels, 400 drawn one by one)" in caption.inner_text()
    # hovering a kernel says which call launched it
    box = chart.bounding_box()
    tooltip = page.locator("#vg-tooltip-element")
    found = ""
    for dy in range(0, int(box["height"]), 4):
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + dy)
        page.wait_for_timeout(60)
        if tooltip.count() and "launched by cudaLaunchKernel" in (text := tooltip.inner_text()):
            found = text
            break
    assert "launched by cudaLaunchKernel" in found and "thread 4242" in found


def test_open_in_perfetto_hands_the_redacted_trace_over(app_url, page):
    from kinetoscope.analyze.redact import redacted_trace

    open_trace(page, app_url, BEFORE)
    page.get_by_role("link", name="Timeline").click()
    page.get_by_role("button", name=f"Open {BEFORE.name} in Perfetto").click()
    frame = page.frame_locator("iframe[title='st.iframe'], iframe").first
    with page.context.expect_page(timeout=60_000) as popup:
        frame.get_by_role("button", name="Open").click(timeout=60_000)
    perfetto = popup.value
    perfetto.wait_for_function("document.title.startsWith('got ')", timeout=60_000)
    expected = len(gzip.compress(redacted_trace(gzip.decompress(BEFORE.read_bytes())), compresslevel=1))
    assert perfetto.title() == f"got {expected} bytes: {BEFORE.name}"


TITLES = {"overview": "Overview", "steps": "Step breakdown", "streams": "Streams", "copies": "Copies", "memory": "Memory",
          "operators": "Operators & kernels", "telemetry": "Telemetry", "timeline": "Timeline", "ranks": "Ranks",
          "distributed": "Distributed", "compare": "Compare", "metadata": "Metadata", "export": "Export"}


@pytest.mark.parametrize("trace", [BEFORE, AFTER], ids=lambda p: p.name)
def test_no_error_element_on_any_page(app_url, page, trace):
    """Every page of two given traces (the 95 MB one is checked by the timeline test; AppTest covers every page of
    every bundled sample), reached by clicking as a user does, with each page's script finished."""
    open_trace(page, app_url, trace)
    seen = {}
    for name, title in TITLES.items():
        go(page, title)
        seen[name] = no_errors(page)
    assert not any(seen.values()), seen


@pytest.fixture(scope="module")
def samples_url():
    """The app on its bundled samples (no path given), as `scripts/run-app` opens it."""
    yield from serve_app()


def test_no_error_element_on_any_page_of_any_bundled_sample(samples_url, page):
    """Every bundled sample, every page, clicked through in Chromium as a user would: no error or exception element."""
    from kinetoscope.app.data import sample_choices

    page.goto(samples_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    seen: dict[str, list[str]] = {}
    for label in [c.label for c in sample_choices()]:
        go(page, "Overview")
        choose(page, "Trace", label, exact=True)
        page.get_by_text(f"{label} ·").first.wait_for(timeout=60_000)
        for name, title in TITLES.items():
            go(page, title)
            errors = no_errors(page)
            if errors:
                seen[f"{label} / {name}"] = errors
    assert not seen, seen
