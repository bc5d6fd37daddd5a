"""The app in a real headless Chromium, as a user clicks through it: upload a loader-bound trace and see the stall;
compare two given traces; a 4-rank upload whose Overview and Distributed view name the straggler; the timeline of
a 95 MB event-dense trace showing kernels within 5 s; Open in Perfetto handing the trace over by Perfetto's
documented handshake (to a stand-in Perfetto page: the machine has no internet); no error element on any page."""

from __future__ import annotations

import gzip
import http.server
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from browserlib import SAMPLES, TITLES, choose, go, no_errors, serve_app

pytestmark = [pytest.mark.browser, pytest.mark.app]

ROOT = Path(__file__).resolve().parents[2]
TRACE = next((SAMPLES / "cpu" / "loader_bound").glob("*.pt.trace.json.gz"))
BEFORE = SAMPLES / "pairs" / "v100_resnet50_num_workers_0_run2.json.gz"
AFTER = SAMPLES / "pairs" / "v100_resnet50_num_workers_4_run2.json.gz"

#: a stand-in for ui.perfetto.dev: answers PING with PONG, then shows the size of the trace it was given
FAKE_PERFETTO = b"""<!doctype html><title>waiting</title><script>
window.addEventListener("message", (evt) => {
  if (evt.data === "PING") { evt.source.postMessage("PONG", "*"); return; }
  if (evt.data && evt.data.perfetto) {
    document.title = "got " + evt.data.perfetto.buffer.byteLength + " bytes: " + evt.data.perfetto.fileName;
  }
});
</script>"""


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


@pytest.fixture(scope="module")
def app_url(fake_perfetto, dense_trace):
    """The app on three given paths (the 95 MB trace first, so it is analysed once the page opens)."""
    yield from serve_app(str(dense_trace), str(BEFORE), str(AFTER),
                         env={**os.environ, "KINETOSCOPE_PERFETTO_URL": fake_perfetto})


def open_trace(page, app_url: str, trace: Path) -> None:
    """Open the app and pick one of its given traces in the sidebar, its analysis shown."""
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    choose(page, "Trace", trace.name)
    page.get_by_text(f"{trace.name} ·").first.wait_for(timeout=60_000)


def test_upload_a_loader_bound_trace_and_see_the_stall(app_url, page, tmp_path):
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
    page.locator("input[type=file]").set_input_files(str(TRACE))
    page.get_by_text("Data loading takes").first.wait_for(timeout=120_000)
    # the analysis is labelled with the uploaded file's name (never a server path)
    assert page.get_by_text(TRACE.name).count() >= 1
    assert not no_errors(page)
    shot = Path(os.environ.get("KINETOSCOPE_SCREENSHOT", tmp_path / "upload.png"))
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000


def test_a_four_rank_upload_names_rank_2_on_the_overview_and_the_distributed_view(app_url, page, tmp_path):
    from tracebuilder import straggler_job

    straggler_job(tmp_path / "job", slow=2, n=4)
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
    page.locator("input[type=file]").set_input_files(sorted(str(p) for p in (tmp_path / "job").glob("*.json")))
    page.get_by_text("headline numbers: rank 2 of 4").first.wait_for(timeout=60_000)
    # the findings are drawn after the headline numbers (the shared-savings replays come first): wait for them
    page.get_by_text("Rank 2 is the straggler", exact=False).first.wait_for(timeout=60_000)
    page.get_by_role("link", name="Distributed").click()
    straggler = page.locator("[data-testid=stMetric]").filter(has_text="Straggler")
    straggler.first.wait_for(timeout=30_000)
    assert "rank 2" in straggler.first.inner_text()
    assert "rank 2" in page.locator("[data-testid=stMetric]").filter(has_text="Most waited for").first.inner_text()
    assert not no_errors(page)
    # the GPU split chart draws a bar per rank (was: the four ranks squashed into one 10 px row)
    chart = page.locator("[data-testid=stVegaLiteChart]").first
    assert chart.bounding_box()["height"] >= 4 * 30


def test_the_timeline_of_a_95_mb_trace_shows_its_kernels(app_url, page, dense_trace):
    """The Timeline of the 95 MB event-dense trace opens on its first two steps with every kernel drawn. (How long it
    takes is measured in BENCHMARKS.md, not asserted here: a browser's timing on a shared machine is no test.)"""
    page.goto(app_url)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)  # the trace is loaded and analysed (cached)
    started = time.perf_counter()
    page.goto(f"{app_url}/timeline")  # opening the Timeline: a fresh page load, the session and the page's script
    caption = page.get_by_text("drawn one by one").first
    caption.wait_for(timeout=60_000)
    chart = page.locator("[data-testid=stVegaLiteChart]").first
    chart.locator("canvas, svg").first.wait_for(timeout=60_000)
    print(f"95 MB trace: Timeline drawn {time.perf_counter() - started:.1f} s after the page was opened")
    assert "(400 kernels, 400 drawn one by one)" in caption.inner_text()


def test_open_in_perfetto_hands_the_redacted_trace_over(app_url, page):
    from kinetoscope.analyze.ingest.redact import redacted_gzip

    open_trace(page, app_url, BEFORE)
    page.get_by_role("link", name="Timeline").click()
    page.get_by_role("button", name=f"Prepare {BEFORE.name} for Perfetto").click()
    frame = page.frame_locator("[data-testid=stMain] iframe").first
    opener = frame.get_by_role("button", name="Open in Perfetto ↗")
    opener.wait_for(timeout=60_000)
    frame.locator("#open:not([disabled])").wait_for(timeout=60_000)  # the stand-in Perfetto answered the check
    with page.context.expect_page(timeout=60_000) as popup:
        opener.click()
    perfetto = popup.value
    perfetto.wait_for_function("document.title.startsWith('got ')", timeout=60_000)
    expected = len(redacted_gzip(gzip.decompress(BEFORE.read_bytes())))
    assert perfetto.title() == f"got {expected} bytes: {BEFORE.name}"


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
