"""Take the README's screenshots of the app, at 1024 px wide, in Debian's headless Chromium:

    .venv/bin/python scripts/screenshots.py [OUT_DIR]      (default docs/img)

Starts ``kinetoscope app`` on the bundled samples, picks each shot's trace in the sidebar as a user does, opens its
page, waits until the page's script has finished and its charts are drawn, and writes the PNG. Re-run it whenever a
page or a finding's wording changes, and look at the pictures before committing them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]

#: (file, paths the app is given (none: the bundled samples), trace as the sidebar lists it, page link title or None
#: for the Overview, what the page must show)
SHOTS = [
    ("app.png", (), "real/v100_resnet50_2021.json.gz", None, "Findings ("),
    ("app-overview.png", (), "real/h100_bert-small.json.gz", None, "Findings ("),
    ("app-timeline.png", (), "real/v100_resnet50_2021.json.gz", "Timeline", "drawn"),
    ("app-upload.png", (), "cpu/loader_bound", None, "Findings ("),
    # a real 2-rank DDP capture on gloo whose rank 1 sleeps 30 ms a step (sample_traces/captures/RUN.md)
    ("app-distributed.png", ("sample_traces/captures/ddp_straggler",), "ddp_straggler", "Distributed", "Straggler"),
]

#: the page's script has finished and every chart on it is drawn (Streamlit's own state on the app's root)
DRAWN = """() => {
  const app = document.querySelector('[data-testid=stApp]');
  const main = document.querySelector('[data-testid=stMain]');
  if (!app || !main || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (main.querySelector('[data-stale=true], [data-testid=stSkeleton]')) return false;
  return [...main.querySelectorAll('[data-testid=stVegaLiteChart]')].every(c => c.querySelector('canvas, svg'));
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for paths in dict.fromkeys(shot[1] for shot in SHOTS):
        _shoot(out, paths, [shot for shot in SHOTS if shot[1] == paths])


def _shoot(out: Path, paths: tuple[str, ...], shots: list[tuple]) -> None:
    port = _free_port()
    app = subprocess.Popen([sys.executable, "-m", "kinetoscope", "app", "--port", str(port), "--headless", *paths],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("the app did not start within 60 s") from None
                time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1024, "height": 1280})
            for name, _, trace, link, shows in shots:
                page.goto(url)
                page.get_by_text("Findings (").first.wait_for(timeout=180_000)
                page.locator("[data-testid=stSelectbox]").filter(has_text="Trace").first.click()
                page.get_by_role("option", name=trace).first.click()
                page.get_by_text(f"{trace.rsplit('/', 1)[-1]} ·").first.wait_for(timeout=180_000)
                if link:
                    page.get_by_role("link", name=link, exact=True).click()
                page.get_by_text(shows).first.wait_for(timeout=180_000)
                page.wait_for_function(DRAWN, timeout=180_000, polling=100)
                page.locator("[data-testid=stMain] h1").first.click()  # the sidebar's selectbox loses its focus ring
                page.screenshot(path=str(out / name), full_page=False)
                print(f"{out / name}: {trace}, {link or 'Overview'}")
            browser.close()
    finally:
        app.terminate()
        app.wait(timeout=30)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img")
