"""Every page of the app, as a user opens it in headless Chromium at a given width: how long each takes to draw,
whether anything on it is cut short or shows a raw value, and a screenshot of it.

    python benchmarks/app_pages.py [--width 1024] [--shots DIR] [--upload] [PATH ...]

Without --upload the app is started on the PATHs (files or job folders; none: the bundled samples) and each is
chosen in the sidebar in turn: *analysed* is the time from choosing it to its findings drawn. With --upload each
PATH (a file) is uploaded: *analysed* is from handing the file to the uploader to its findings drawn (upload,
gunzip, parse, every analysis with the what-if replay, render). Then *first paint* of every page: from the click on
its link to its heading drawn, its script finished (Streamlit's own script state) and every chart and table drawn.

Each page is checked for: text cut to an ellipsis (HTML elements, chart labels), a raw value in what it says (None,
nan, six decimals, exponents, unit-suffixed column names), an error or exception element. Tables draw on a canvas
and are checked through AppTest (tests/integration/test_app.py::test_every_page_of_every_bundled_sample). Needs
playwright and Debian's chromium.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

PAGES = {"Overview": "Kinetoscope", "Step breakdown": "Step breakdown", "Streams": "CUDA streams", "Copies": "Copies",
         "Memory": "Memory", "Operators & kernels": "Operators and kernels", "Modules": "Modules",
         "Telemetry": "Telemetry", "Timeline": "Timeline", "Ranks": "Ranks", "Distributed": "Distributed",
         "Compare": "Compare", "Metadata": "Metadata", "Export": "Export"}
_FINISHED = """(() => { const app = document.querySelector('[data-testid=stApp]');
  return app && app.getAttribute('data-test-script-state') === 'notRunning'
    && !document.querySelector('[data-testid=stMain] [data-stale=true]'); })()"""
_DRAWN = """([heading]) => {
  const main = document.querySelector('[data-testid=stMain]');
  if (!main || !""" + _FINISHED + """) return false;
  if (heading && ![...main.querySelectorAll('h1')].some(e => e.innerText.startsWith(heading))) return false;
  if (main.querySelector('[data-testid=stSkeleton], [data-testid=stSkeletonElement]')) return false;
  return [...main.querySelectorAll('[data-testid=stVegaLiteChart]')].every(c => c.querySelector('canvas, svg'))
    && [...main.querySelectorAll('[data-testid=stDataFrame]')].every(g => g.querySelector('canvas'));
}"""
RAW = (r"\\bNone\\b|\\bnan\\b|\\bNaN\\b|\\b[1-9]\\d*\\.\\d{6}\\b|\\d[eE][+-]\\d\\d\\b"
       r"|\\b[a-z]+_(us|ns|bytes|fraction|mib)\\b")
_AUDIT = """() => {
  const main = document.querySelector('[data-testid=stMain]');
  const cut = [];
  for (const e of main.querySelectorAll('*')) {
    const st = getComputedStyle(e);
    if (st.textOverflow === 'ellipsis' && e.scrollWidth > e.clientWidth + 1 && e.textContent.trim() && e.offsetParent)
      cut.push(e.textContent.trim().slice(0, 60));
  }
  for (const svg of main.querySelectorAll('[data-testid=stVegaLiteChart] svg')) {
    const box = svg.closest('[data-testid=stVegaLiteChart]').getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (!t.textContent.trim() || r.width === 0 || t.getAttribute('opacity') === '0') continue;  // hidden: overlap
      if (t.textContent.endsWith('…') || r.right > box.right + 3)  // rotated labels' boxes reach 1-2 px out
        cut.push('chart label ' + t.textContent.slice(0, 60));
    }
  }
  const raw = [...main.innerText.matchAll(new RegExp('""" + RAW + """', 'g'))].map(m => m[0]);
  const errors = [...document.querySelectorAll('[data-testid=stException], [data-testid=stAlertContentError]')]
    .map(e => e.innerText.slice(0, 120));
  return {cut, raw, errors, wide: main.scrollWidth > main.clientWidth + 1};
}"""


def _serve(paths: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "kinetoscope", "app", "--port", str(port), "--headless", *paths],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("the app did not start")


def _wait(page, heading: str | None, timeout_ms: int = 600_000) -> None:
    page.wait_for_function(_DRAWN, arg=[heading], timeout=timeout_ms, polling=20)


def _pages(page, shots: Path | None, label: str) -> tuple[dict[str, float], dict[str, dict]]:
    paints, problems = {}, {}
    for title, heading in PAGES.items():
        t0 = time.perf_counter()
        page.get_by_role("link", name=title, exact=True).click()
        _wait(page, heading)
        paints[title] = time.perf_counter() - t0
        got = page.evaluate(_AUDIT)
        if got["cut"] or got["raw"] or got["errors"] or got["wide"]:
            problems[title] = got
        if shots is not None:
            folder = shots / re.sub(r"[^A-Za-z0-9._-]+", "_", label)
            folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(folder / f"{re.sub(r'[^a-z]+', '-', title.lower()).strip('-')}.png"))
    return paints, problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--height", type=int, default=1800, help="tall enough for a page's screenshot")
    ap.add_argument("--shots", type=Path)
    ap.add_argument("--upload", action="store_true")
    args = ap.parse_args()
    proc, url = _serve([] if args.upload else args.paths)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    failures = 0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(url)
            _wait(page, None)
            if args.upload:
                jobs = [(Path(f).name, Path(f)) for f in args.paths]
            else:
                from kinetoscope.app import data  # the sidebar's labels, as the app makes them

                choices = data.path_choices([str(Path(p).resolve()) for p in args.paths]) if args.paths else \
                    data.sample_choices()
                jobs = [(c.label, None) for c in choices]
            for label, path in jobs:
                t0 = time.perf_counter()
                if path is not None:
                    page.goto(url)
                    _wait(page, None)
                    page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
                    page.locator("input[type=file]").wait_for(state="attached")
                    t0 = time.perf_counter()
                    page.locator("input[type=file]").set_input_files(str(path))
                    page.wait_for_function(f"() => document.body.innerText.includes({label[-40:]!r} + ' ·')",
                                           timeout=900_000, polling=50)
                else:
                    page.get_by_role("link", name="Overview", exact=True).click()
                    _wait(page, "Kinetoscope")
                    page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").first.click()
                    t0 = time.perf_counter()
                    page.get_by_role("option", name=label, exact=True).first.click()
                    page.wait_for_function(f"() => document.body.innerText.includes({label[-40:]!r} + ' ·')",
                                           timeout=900_000, polling=50)
                _wait(page, "Kinetoscope")
                analysed = time.perf_counter() - t0
                paints, problems = _pages(page, args.shots, label)
                failures += bool(problems)
                size = f", {path.stat().st_size / 1e6:,.1f} MB" if path is not None else ""
                print(f"{label}{size}: analysed and drawn in {analysed:.2f} s; first paint "
                      + ", ".join(f"{k} {v:.2f}" for k, v in paints.items()) + " s", flush=True)
                for title, got in problems.items():
                    print(f"  {title}: {got}", flush=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("no page cut short, no raw value, no error" if not failures else f"{failures} job(s) with a problem")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
