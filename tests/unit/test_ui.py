"""The app's door to Streamlit (kinetoscope/app/ui.py): what a trace wrote is shown as text, secrets redacted, and
no screen can reach Streamlit around it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
from kinetoscope.app import ui  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "kinetoscope" / "app"
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"

pytestmark = pytest.mark.app


@pytest.mark.parametrize("raw, shown", [
    ("[click](http://evil/x)", r"\[click\](http\://evil/x)"),
    ("![p](http://127.0.0.1:9/p.gif)", r"!\[p\](http\://127.0.0.1:9/p.gif)"),
    ("<img src=x> <b>b</b>", r"\<img src=x\> \<b\>b\</b\>"),
    ("__getitem__ *a* ~b~ `c` $x$ a|b &amp;", r"\_\_getitem\_\_ \*a\* \~b\~ \`c\` \$x\$ a\|b \&amp;"),
    ("www.example.com me@example.com", r"www\.example.com me\@example.com"),
    ("# heading", r"\# heading"), ("- item", r"\- item"), ("3. item", r"3\. item"), ("> quote", r"\> quote"),
    (":smile: :material/home:", ":\u200bsmile: :\u200bmaterial/home:"),
    ("1.5 ms -5.0% #3 aten::mm", "1.5 ms -5.0% #3 aten::mm"),  # ordinary text unchanged
    ("a\n\n# b\tc", "a # b c"),  # whitespace collapsed: no new block
])
def test_text_escapes_markup_and_nothing_else(raw, shown):
    assert ui.text(raw) == shown
    assert ui.unescaped(ui.text(raw)) == ui.plain(raw)


def test_text_redacts_and_shortens_long_words():
    assert ui.text(f"op {TOKEN}") == r"op \[redacted\]"
    long = "k" * 10_000
    assert ui.plain(f"a {long} b") == f"a {'k' * 200}… (10,000 characters) b"


def test_md_escapes_its_arguments_not_its_template():
    out = ui.md("**What to do:** {} ({:.1%}) {}", "use __init__", 0.5, ui.md("*{}*", "x_y"))
    assert out == r"**What to do:** use \_\_init\_\_ (50.0%) *x\_y*"
    assert isinstance(out, ui.Md) and ui.text(out) is out
    assert ui.bullets(["a_b", "[c](d)"]) == "- a\\_b\n- \\[c\\](d)"


def test_tables_are_redacted_cell_by_cell_with_their_labels():
    frame = pd.DataFrame({"name": ["aten::mm", f"cudaSecret {TOKEN}", None], "calls": [1, 2, 3],
                          f"col {TOKEN}": ["x", "y", "z"]})
    out = ui.redact_frame(frame)
    assert list(out["name"][:2]) == ["aten::mm", "cudaSecret [redacted]"] and out["name"].isna().iloc[2]
    assert out["name"].dtype == frame["name"].dtype
    assert list(out.columns) == ["name", "calls", "col [redacted]"] and list(out["calls"]) == [1, 2, 3]
    assert list(frame["name"])[1] == f"cudaSecret {TOKEN}"  # the analysis's own table is left alone
    cat = pd.DataFrame({"name": pd.Categorical([TOKEN, "a", TOKEN])})
    assert list(ui.redact_frame(cat)["name"]) == ["[redacted]", "a", "[redacted]"]
    styled, _ = ui.table_data(frame, {"calls": "{:,}"})
    assert list(styled.data["name"])[1] == "cudaSecret [redacted]"


def test_tables_show_numbers_in_their_format_and_unknown_as_blank():
    """Was: "None" for unknown, "2.000000" for a float column without a format."""
    frame = pd.DataFrame({"name": ["a", None], "calls": [2.0, np.nan], "ms": [1.23456, 2.5], "share": [0.25, None],
                          "hit": [True, False]})
    styled, _ = ui.table_data(frame, {"share": "{:.1%}"}, highlight=[False, True])
    html = styled.to_html()
    assert ">2<" in html and ">1.235<" in html and ">2.500<" in html and ">25.0%<" in html
    assert "None" not in html and "nan" not in html and ">yes<" in html and ">no<" in html
    assert html.count(ui.HIGHLIGHT) == 1 and "#T_" in html.split(ui.HIGHLIGHT)[0]  # one CSS rule
    assert sorted(styled._compute().ctx) == [(1, c) for c in range(5)]  # for the second row's five cells
    big = pd.DataFrame({"ms": np.arange(50_000) / 7, "gap": [np.nan] + [1.0] * 49_999})
    data, config = ui.table_data(big, {"ms": "{:,.3f}"})
    assert config["ms"]["type_config"]["format"] == "%,.3f" and list(data["gap"][:2]) == ["", "1"]


def test_a_column_holding_an_unknown_is_text_with_the_unknown_empty():
    """Was: a CPU job's GPU split (None on every rank) read "None" in the Distributed page's Ranks table: the grid
    draws a missing cell as a grey "None" whatever the Styler's na_rep says."""
    frame = pd.DataFrame({"rank": [0, 1], "compute_only_ms": [None, None], "wait_ms": [1.5, None],
                          "name": ["a", None], "flag": [True, None], "steps": [10, 12]})
    styled, _ = ui.table_data(frame, {"compute_only_ms": "{:,.3f}", "wait_ms": "{:,.3f}"})
    data = styled.data
    assert list(data["compute_only_ms"]) == ["", ""] and list(data["wait_ms"]) == ["1.500", ""]
    assert list(data["name"]) == ["a", ""] and list(data["flag"]) == ["yes", ""]
    assert not data.isna().any().any()
    assert list(data["steps"]) == [10, 12] and data["steps"].dtype.kind == "i"  # complete: stays numbers, sorts as such
    assert frame["compute_only_ms"].isna().all()  # the caller's table is left alone


def test_charts_are_redacted_in_their_data_and_labels():
    import altair as alt

    data = pd.DataFrame({"row": [f"thread {TOKEN}", "b"], "ms": [1.0, 2.0]})
    chart = alt.Chart(data).mark_bar().encode(y=alt.Y("row:N", sort=[f"thread {TOKEN}", "b"], title=TOKEN), x="ms:Q")
    spec = ui.redact_chart(alt.layer(chart, chart)).to_dict()
    assert TOKEN not in str(spec) and "thread [redacted]" in str(spec)


def test_downloads_take_redacted_data_only(monkeypatch):
    with pytest.raises(TypeError, match="redacted data only"):
        ui.st.download_button("CSV", b"raw", file_name="x.csv")
    assert TOKEN not in ui.redacted_csv(pd.DataFrame({"name": [TOKEN]})).decode()
    assert ui.redacted_json(f'{{"source": "{TOKEN}"}}') == b'{"source": "[redacted]"}'


def test_the_door_refuses_what_it_does_not_know():
    with pytest.raises(AttributeError, match="not allowed"):
        ui.st.write("x")
    with pytest.raises(AttributeError, match="not allowed"):
        ui.st.sidebar.html("<b>x</b>")


def _app_modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if p.name != "ui.py")


def test_no_screen_reaches_streamlit_around_the_door():
    """Only ui.py imports Streamlit (launch.py checks it is installed, cache.py asks its runtime which sessions are
    alive); nothing asks for raw HTML; Md is made only by
    ui.md, whose template is always a literal in the code (what a trace wrote can only be an argument)."""
    bad = []
    for path in _app_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                shows = [n for n in names if (n == "streamlit" or n.startswith("streamlit."))
                         and not n.startswith("streamlit.runtime")]
                if isinstance(node, ast.ImportFrom) and node.module == "streamlit":
                    shows = [a.name for a in node.names if a.name != "runtime"]
                if shows and path.name != "launch.py":
                    bad.append(f"{path.name}:{node.lineno} imports streamlit")
            if isinstance(node, ast.keyword) and node.arg == "unsafe_allow_html":
                bad.append(f"{path.name}:{node.value.lineno} unsafe_allow_html")
            if isinstance(node, ast.Call):
                fn = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(
                    node.func, ast.Attribute) else ""
                if fn == "Md":
                    bad.append(f"{path.name}:{node.lineno} makes an Md")
                if fn == "md" and not (node.args and isinstance(node.args[0], ast.Constant)
                                       and isinstance(node.args[0].value, str)):
                    bad.append(f"{path.name}:{node.lineno} md() with a template that is not a literal")
    assert not bad, bad


@pytest.mark.parametrize("value, shown", [(3146000.0, "3,146,000"), (12.3456, "12.35"), (0.012345, "0.01235"),
                                          (2.0, "2"), (0.5, "0.5"), (-3.25, "-3.25"), (1234.5678, "1,235"),
                                          (None, "n/a"), (float("nan"), "n/a"), (7, "7")])
def test_numbers_read_as_numbers(value, shown):
    """Was: '3.146e+06' and '2.000000' in evidence and Compare."""
    from kinetoscope.render.format import evidence_lines, number

    assert number(value) == shown
    if value is not None:
        assert evidence_lines({"ratio": value}) == [f"ratio: {'unknown' if False else shown}"]


def test_a_chart_without_a_text_alternative_is_refused():
    import altair as alt

    with pytest.raises(TypeError, match="text alternative"):
        ui.st.altair_chart(alt.Chart(pd.DataFrame({"a": [1]})).mark_bar().encode(x="a"))


def test_a_fix_estimated_to_cost_more_than_it_saves_reads_slower():
    """A replay where the fix makes the step longer (a hand-over dearer than the wait it removes): 'slower' with
    the cost as a positive number, never '~-0.33 ms per step faster (-9%)'."""
    from kinetoscope.render.format import worth

    est = {"method": "replay", "saving_us_per_step": -330.0, "saving_fraction": -0.09, "step_us_after": 3920.0,
           "num_workers": 3, "cpus": 2}
    assert worth(est) == "fix this with num_workers=3 on 2 CPUs: ~0.33 ms per step slower (9%; 3.92 ms per step after)"
    est.update(saving_us_per_step=330.0, saving_fraction=0.09, step_us_after=3260.0)
    assert worth(est) == "fix this with num_workers=3 on 2 CPUs: ~0.33 ms per step faster (9%; 3.26 ms per step after)"
