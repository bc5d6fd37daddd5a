"""The app in a real headless Chromium: upload a loader-bound trace, see the DataLoader stall finding."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "kinetoscope" / "app" / "main.py"
TRACE = next((ROOT / "sample_traces" / "cpu" / "loader_bound").glob("*.pt.trace.json.gz"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
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


def test_upload_a_loader_bound_trace_and_see_the_stall(app_url, tmp_path):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(app_url)
        page.get_by_text("Findings (").first.wait_for(timeout=60_000)  # opens on a bundled sample
        page.locator("[data-testid=stRadioOption]").filter(has_text="Upload").click()
        page.locator("input[type=file]").set_input_files(str(TRACE))
        started = time.perf_counter()
        page.get_by_text("Data loading takes").first.wait_for(timeout=60_000)
        elapsed = time.perf_counter() - started
        # the analysis is labelled with the uploaded file's name (never a server path)
        assert page.get_by_text(TRACE.name).count() >= 1
        shot = Path(os.environ.get("KINETOSCOPE_SCREENSHOT", tmp_path / "upload.png"))
        page.screenshot(path=str(shot), full_page=False)
        browser.close()
    assert shot.stat().st_size > 10_000
    assert elapsed < 30
