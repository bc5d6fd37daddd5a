"""Driving the app in a real headless Chromium (Debian's, through Playwright): start it, open pages, wait for a
page's script to finish (conditions, never sleeps), and a local HTTP server that records every request it gets
(the bait a hostile trace points images and links at)."""

from __future__ import annotations

import http.server
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

#: each page's link title and the heading it draws first (in the main area)
HEADINGS = {"Overview": "Kinetoscope", "Step breakdown": "Step breakdown", "Streams": "CUDA streams",
            "Copies": "Copies", "Memory": "Memory", "Operators & kernels": "Operators and kernels",
            "Modules": "Modules", "Telemetry": "Telemetry",
            "Timeline": "Timeline", "Ranks": "Ranks", "Distributed": "Distributed", "Compare": "Compare",
            "Metadata": "Metadata", "Export": "Export", "Hang": "Hang"}
TITLES = {"overview": "Overview", "steps": "Step breakdown", "streams": "Streams", "copies": "Copies",
          "memory": "Memory", "operators": "Operators & kernels", "modules": "Modules", "telemetry": "Telemetry",
          "timeline": "Timeline", "ranks": "Ranks",
          "distributed": "Distributed", "compare": "Compare", "metadata": "Metadata", "export": "Export"}
#: the page's script has finished: Streamlit's own state on the app's root (its status widget shows only after a
#: delay, so a script still sending elements looked finished), and no element left stale from the run before
_FINISHED = """(() => {
  const app = document.querySelector('[data-testid=stApp]');
  return app && app.getAttribute('data-test-script-state') === 'notRunning'
    && app.getAttribute('data-test-connection-state') === 'CONNECTED'
    && !document.querySelector('[data-testid=stMain] [data-stale=true]');
})()"""
_SHOWN = """([heading]) => {
  const main = document.querySelector('[data-testid=stMain]') || document;
  const h = [...main.querySelectorAll('h1, h2')].some(e => e.innerText.startsWith(heading));
  return h && """ + _FINISHED + """;
}"""
_IDLE = "() => " + _FINISHED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class Bait:
    """A local HTTP server that answers everything with a 1-pixel GIF and records each request's path."""

    GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")

    def __init__(self) -> None:
        self.requests: list[str] = []
        bait = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                bait.requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()
                self.wfile.write(Bait.GIF)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def launch_browser():
    """A headless Chromium for a module's tests (the ``browser`` fixture in tests/conftest.py)."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


def open_page(browser):
    """A fresh 1400 x 1200 context and page (the ``page`` fixture in tests/conftest.py)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    yield context.new_page()
    context.close()


def choose(page, label: str, option: str, exact: bool = False) -> None:
    """Pick ``option`` in the selectbox labelled ``label``."""
    page.locator("[data-testid=stSelectbox]").filter(has_text=label).first.click()
    page.get_by_role("option", name=option, exact=exact).first.click()


def go(page, title: str) -> None:
    """Click a page's link and wait until that page is drawn and its script has finished."""
    page.get_by_role("link", name=title, exact=True).click()
    page.wait_for_function(_SHOWN, arg=[HEADINGS[title]], timeout=120_000, polling=50)


def settled(page, timeout_ms: int = 120_000) -> None:
    """Wait until the page's script has finished running (after a click that reruns it)."""
    page.wait_for_function(_IDLE, timeout=timeout_ms, polling=50)


def no_errors(page) -> list[str]:
    errors = page.locator("[data-testid=stException], [data-testid=stAlertContentError]")
    return [errors.nth(i).inner_text() for i in range(errors.count())]


_DRAWN = """() => {
  const main = document.querySelector('[data-testid=stMain]');
  if (!main || !""" + _FINISHED + """) return false;
  if (main.querySelector('[data-testid=stSkeleton], [data-testid=stSkeletonElement]')) return false;  // still loading
  const charts = [...main.querySelectorAll('[data-testid=stVegaLiteChart]')];
  const grids = [...main.querySelectorAll('[data-testid=stDataFrame]')];
  return charts.every(c => c.querySelector(
      'canvas, svg .mark-rect, svg .mark-line, svg .mark-area, svg .mark-text, svg .mark-symbol'))
    && grids.every(g => g.querySelector('canvas'));
}"""


def drawn(page, timeout_ms: int = 120_000) -> None:
    """Wait until the page's script has finished and every chart and table on it is drawn."""
    page.wait_for_function(_DRAWN, timeout=timeout_ms, polling=50)
