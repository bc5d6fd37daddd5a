"""The Hang page in Chromium (issue 32): a folder of hang dumps opens on it, the stuck rank's stack is text (a
frame's Markdown and HTML shown as written, no link, image or bold made of it), and a trace beside the dumps keeps
its pages."""

from __future__ import annotations

import pytest
from browserlib import SAMPLES, go, no_errors, serve_app, settled
from hangbuilder import dump, history, write_dumps

from kinetoscope.hangdump import Frame

pytestmark = [pytest.mark.browser, pytest.mark.app]

HOSTILE = Frame(file="/home/me/[x](javascript:alert).py", line=12, function="**__getitem__**",
                code="![pixel](https://tracker.invalid/p.png) <b>read()</b>")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("hung")
    job = write_dumps(root / "job", [dump(r, history(3) if r == 1 else history(3, op="all_reduce"),
                                          frames=[HOSTILE] if r == 1 else None) for r in range(4)])
    (job / "trace.json.gz").write_bytes(next((SAMPLES / "cpu" / "healthy").glob("*.pt.trace.json.gz")).read_bytes())
    yield from serve_app(str(job))


def test_a_hung_job_opens_on_the_hang_page_with_its_stacks_as_text(app, page):
    page.goto(app)
    page.get_by_text("Stacks").first.wait_for(timeout=120_000)
    settled(page)
    main = page.locator("[data-testid=stMain]")
    text = main.inner_text()
    assert "Hang at collective #4 (all_reduce[[4, 3]]) of process group 0: rank 1 never entered it" in text
    code = main.locator("[data-testid=stCode]").first.inner_text()
    assert 'File "/home/me/[x](javascript:alert).py", line 12, in **__getitem__**' in code
    assert "![pixel](https://tracker.invalid/p.png) <b>read()</b>" in code
    # nothing of the frame became markup: no image fetched, no link, no bold
    assert main.locator("img[src*='tracker.invalid']").count() == 0
    assert main.locator("a[href^='javascript']").count() == 0
    assert not any("__getitem__" in main.locator("strong").nth(i).inner_text()
                   for i in range(main.locator("strong").count()))
    errors = no_errors(page)  # the finding's own alert, and nothing else
    assert len(errors) == 1 and errors[0].startswith("Hang at collective #4"), errors
    go(page, "Overview")
    assert "Hang at collective #4" in page.locator("[data-testid=stMain]").inner_text()
