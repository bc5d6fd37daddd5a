"""Item 7 of issue 29 in Chromium: the Perfetto hand-off offline (the page says at once that the Perfetto UI cannot
be reached and offers the file), no two buttons sharing a label, and a redacted .gz coming back as .gz."""

from __future__ import annotations

import gzip
import os

import pytest
from browserlib import SAMPLES, free_port, go, serve_app, settled

pytestmark = [pytest.mark.browser, pytest.mark.app]

#: a real trace with a Hugging Face token in its metadata
TRACE = SAMPLES / "real" / "h100_bert-small.json.gz"
SECRET = b"hf_Ejxfcd"


@pytest.fixture(scope="module")
def offline_app():
    """The app with its Perfetto UI at a port nothing listens on (an offline machine)."""
    yield from serve_app(str(TRACE), env={**os.environ, "KINETOSCOPE_PERFETTO_URL": f"http://127.0.0.1:{free_port()}"})


def expected() -> bytes:
    from kinetoscope.analyze.ingest.redact import redacted_trace

    return redacted_trace(gzip.decompress(TRACE.read_bytes()))


_LABELS = """() => {
  const labels = [];
  const collect = (doc) => {
    for (const e of doc.querySelectorAll('button, a[href], [role=button]')) {
      const style = e.ownerDocument.defaultView.getComputedStyle(e);
      if (style.display === 'none' || style.visibility === 'hidden') continue;
      const t = (e.innerText || e.textContent || '').trim();
      if (t) labels.push(t);
    }
  };
  const main = document.querySelector('[data-testid=stMain]');
  collect(main);
  for (const f of main.querySelectorAll('iframe')) { try { collect(f.contentDocument); } catch (e) {} }
  return labels;
}"""


def _duplicates(labels: list[str]) -> list[str]:
    return sorted({t for t in labels if labels.count(t) > 1})


def test_offline_perfetto_is_said_at_once_and_the_file_offered(offline_app, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
    page = context.new_page()
    page.goto(offline_app)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    go(page, "Timeline")
    page.get_by_role("button", name=f"Prepare {TRACE.name} for Perfetto").click()
    frame = page.frame_locator("[data-testid=stMain] iframe").first
    frame.get_by_text("cannot be reached from this browser").wait_for(timeout=60_000)
    assert frame.get_by_role("button", name="Open in Perfetto ↗").is_disabled()
    with page.expect_download(timeout=60_000) as got:
        frame.get_by_role("link", name=f"Save {TRACE.name} to open it elsewhere").click()
    download = got.value
    data = open(download.path(), "rb").read()
    settled(page)
    labels = page.evaluate(_LABELS)
    context.close()
    assert download.suggested_filename == TRACE.name  # a .gz comes back as .gz
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data) == expected() and SECRET not in gzip.decompress(data)
    assert not _duplicates(labels), labels


def test_the_export_page_hands_out_the_redacted_gz_and_no_two_buttons_share_a_label(offline_app, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
    page = context.new_page()
    page.goto(offline_app)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    go(page, "Export")
    page.get_by_role("button", name=f"Prepare the redacted {TRACE.name}").click()
    button = page.get_by_role("button", name=f"Download {TRACE.name}", exact=True)
    button.wait_for(timeout=120_000)
    settled(page)
    page.frame_locator("[data-testid=stMain] iframe").first.get_by_text("cannot be reached").wait_for(timeout=60_000)
    labels = page.evaluate(_LABELS)
    with page.expect_download(timeout=60_000) as got:
        button.click()
    download = got.value
    data = open(download.path(), "rb").read()
    context.close()
    assert download.suggested_filename == TRACE.name
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data) == expected()
    assert not _duplicates(labels), labels
    assert "Open in Perfetto ↗" in labels and f"Download {TRACE.name}" in labels
