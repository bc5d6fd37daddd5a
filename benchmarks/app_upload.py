"""Time from choosing a file in the app's uploader to the findings on screen, then the first paint of every page
for that upload (from the click on the page's link to the page drawn and the script finished), in headless Chromium.

Run: python benchmarks/app_upload.py TRACE [TRACE ...]   (needs Debian's chromium and playwright)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

APP = Path(__file__).resolve().parents[1] / "kinetoscope" / "app" / "main.py"


#: each page's link, and the heading it draws first
PAGES = {"Step breakdown": "Step breakdown", "Streams": "CUDA streams", "Copies": "Copies", "Memory": "Memory",
         "Operators & kernels": "Operators and kernels", "Telemetry": "Telemetry", "Timeline": "Timeline",
         "Ranks": "Ranks", "Distributed": "Distributed", "Compare": "Compare", "Metadata": "Metadata",
         "Export": "Export", "Overview": "Kinetoscope"}

_DONE = """([heading]) => {
  const h = [...document.querySelectorAll('h1, h2')].some(e => e.innerText.startsWith(heading));
  const running = document.querySelector('[data-testid=stStatusWidget]');
  const charts = [...document.querySelectorAll('[data-testid=stVegaLiteChart]')]
    .every(c => c.querySelector('canvas, svg'));
  const stale = document.querySelector('[data-stale=true]');
  return h && !running && charts && !stale;
}"""


def first_paint(page, title: str) -> float:
    """Seconds from clicking the page's link to its heading drawn, the script finished (Streamlit's status widget
    gone, no stale element left from the page before) and every chart's canvas in place."""
    t0 = time.perf_counter()
    page.get_by_role("link", name=title, exact=True).click()
    page.wait_for_function(_DONE, arg=[PAGES[title]], timeout=120_000, polling=20)
    return time.perf_counter() - t0


def main(traces: list[Path]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
                             "--server.headless", "true", "--server.maxUploadSize", "512"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            for trace in traces:
                page = browser.new_page()
                page.goto(url)
                page.get_by_text("Findings (").first.wait_for(timeout=120_000)
                page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
                page.locator("input[type=file]").wait_for(state="attached")
                t0 = time.perf_counter()
                page.locator("input[type=file]").set_input_files(str(trace))
                page.get_by_text(trace.name[:12]).first.wait_for(timeout=120_000)
                page.get_by_text("Findings (").first.wait_for(timeout=120_000)
                page.wait_for_function(f"() => document.body.innerText.includes('{trace.name[:12]}')",
                                       timeout=120_000)
                elapsed = time.perf_counter() - t0
                print(f"{trace.name}: {trace.stat().st_size / 1e6:.1f} MB file, findings shown after {elapsed:.2f} s")
                paints = {title: first_paint(page, title) for title in PAGES}
                print("  first paint per page: " + ", ".join(f"{k} {v:.2f} s" for k, v in paints.items()))
                page.close()
            browser.close()
    finally:
        proc.terminate()


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
