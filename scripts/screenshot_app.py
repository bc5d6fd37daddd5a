"""Screenshot the running app in headless Chromium (for the README): python scripts/screenshot_app.py URL OUT.png"""

from __future__ import annotations

import sys

from playwright.sync_api import sync_playwright


def main(url: str, out: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        page.goto(url)
        page.get_by_text("Findings (").first.wait_for(timeout=120_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=out, full_page=False)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
