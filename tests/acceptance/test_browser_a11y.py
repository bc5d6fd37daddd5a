"""Item 14 of issue 29 in Chromium: on every page, one <h1>, a text alternative on every chart (its description:
what it shows, in words, with its numbers), text at a contrast of at least 4.5:1 against what it sits on (HTML and
chart text), and keyboard focus always visible."""

from __future__ import annotations

import pytest
from browserlib import SAMPLES, TITLES, drawn, go, serve_app

pytestmark = [pytest.mark.browser, pytest.mark.app]

#: WCAG relative luminance and contrast; a colour with alpha is blended over what is behind it
_AUDIT = """() => {
  const parse = (c) => { const m = (c || '').match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const hex = (h, a) => ({r: parseInt(h.slice(1, 3), 16), g: parseInt(h.slice(3, 5), 16),
                          b: parseInt(h.slice(5, 7), 16), a});
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const behind = (e) => { const layers = [];
    for (let x = e; x; x = x.parentElement) { const b = parse(getComputedStyle(x).backgroundColor);
      if (b && b.a > 0) { layers.push(b); if (b.a >= 1) break; } }
    let base = {r: 255, g: 255, b: 255};
    for (const l of layers.reverse()) base = {r: l.r * l.a + base.r * (1 - l.a), g: l.g * l.a + base.g * (1 - l.a),
                                              b: l.b * l.a + base.b * (1 - l.a)};
    return base; };
  const ratio = (fg, bg) => {
    const c = {r: fg.r * fg.a + bg.r * (1 - fg.a), g: fg.g * fg.a + bg.g * (1 - fg.a),
               b: fg.b * fg.a + bg.b * (1 - fg.a)};
    const a = lum(c), b = lum(bg); return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); };
  const low = [];
  for (const e of document.querySelectorAll('[data-testid=stMain] *, [data-testid=stSidebar] *')) {
    if (![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    if (e.closest('svg') || e.closest('[aria-hidden=true]') || e.closest('[disabled]')) continue;
    const st = getComputedStyle(e);
    if (st.visibility === 'hidden' || st.display === 'none' || !e.offsetParent) continue;
    // a slider's value sits above its thumb, on the page: measured against the page, not the thumb
    const r = ratio(parse(st.color),
                    e.closest('[data-testid=stSliderThumbValue]') ? {r: 255, g: 255, b: 255} : behind(e));
    if (r < 4.5) low.push(r.toFixed(2) + ': ' + e.textContent.trim().slice(0, 50));
  }
  for (const t of document.querySelectorAll('[data-testid=stVegaLiteChart] svg text')) {
    const fill = t.getAttribute('fill'); if (!fill || !/^#[0-9a-f]{6}$/i.test(fill) || !t.textContent.trim()) continue;
    const r = ratio(hex(fill, parseFloat(t.getAttribute('fill-opacity') || '1')), {r: 255, g: 255, b: 255});
    if (r < 4.5) low.push(r.toFixed(2) + ' chart text: ' + t.textContent.slice(0, 50));
  }
  const charts = [...document.querySelectorAll('[data-testid=stMain] [data-testid=stVegaLiteChart]')];
  return {h1: document.querySelectorAll('h1').length, low: [...new Set(low)],
          unlabelled: charts.filter(c => !(c.getAttribute('aria-label') || '').trim()).length, charts: charts.length};
}"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from tracebuilder import straggler_job

    job = tmp_path_factory.mktemp("a11y") / "job"
    straggler_job(job, slow=2, n=4)
    yield from serve_app(str(SAMPLES / "real" / "v100_resnet50_2021.json.gz"), str(job))


def test_one_h1_text_alternatives_and_contrast_on_every_page(app, browser):
    context = browser.new_context(viewport={"width": 1024, "height": 1400})
    page = context.new_page()
    page.goto(app)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    seen, problems = 0, {}
    for label in ("v100_resnet50_2021.json.gz", "job"):
        if label == "job":
            go(page, "Overview")
            page.locator("[data-testid=stSelectbox]").filter(has_text="Trace").first.click()
            page.get_by_role("option", name="job").last.click()
            page.get_by_text("job ·").first.wait_for(timeout=60_000)
        for name, title in TITLES.items():
            go(page, title)
            drawn(page)
            got = page.evaluate(_AUDIT)
            seen += got["charts"]
            bad = []
            if got["h1"] != 1:
                bad.append(f"{got['h1']} h1")
            if got["unlabelled"]:
                bad.append(f"{got['unlabelled']} of {got['charts']} charts without a text alternative")
            bad += got["low"]
            if bad:
                problems[f"{label} / {name}"] = bad
    context.close()
    assert seen >= 10  # the pages drew their charts
    assert not problems, problems


def test_keyboard_focus_is_always_visible(app, page):
    page.goto(app)
    page.get_by_text("Findings (").first.wait_for(timeout=120_000)
    drawn(page)
    hidden = []
    for _ in range(12):
        page.keyboard.press("Tab")
        got = page.evaluate("""() => { const e = document.activeElement; if (!e || e === document.body) return null;
          const s = getComputedStyle(e);
          return {what: e.tagName + ' ' + (e.innerText || e.getAttribute('aria-label') || '').slice(0, 30),
                  outline: s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2,
                  shadow: s.boxShadow !== 'none'}; }""")
        if got and not (got["outline"] or got["shadow"]):
            hidden.append(got["what"])
    assert not hidden, hidden
