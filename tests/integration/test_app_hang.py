"""The Hang page and the Fleet page's hung jobs, through streamlit.testing (dumps built in code: tests/hangbuilder.py).

AppTest cannot switch between pages, so each test picks the start page (or lets the app choose it) before the first
run; tests/acceptance/test_browser_hang.py opens a hung job in a real browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("streamlit")
from hangbuilder import USER, dump, history, write_dumps  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from kinetoscope.app.ui import unescaped  # noqa: E402
from kinetoscope.hangdump import Frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "kinetoscope" / "app" / "main.py"
SAMPLES = ROOT / "sample_traces"

pytestmark = pytest.mark.app

#: a frame whose every field would be markup if it reached Markdown
HOSTILE = Frame(file="/home/me/[x](javascript:alert).py", line=12, function="**__getitem__**",
                code="![pixel](https://tracker/p.png) <b>read()</b>")


def open_app(page: str | None = None, **state: Any) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, value in state.items():
        at.session_state[key] = value
    if page:
        at.session_state["start_page"] = page
    return at.run()


def skipped_job(folder: Path) -> Path:
    """4 ranks; #1-#3 completed everywhere; rank 1 never entered #4 (blocked in a Dataset's __getitem__, its frames
    hostile text), the others wait in all_reduce [[4, 3]]."""
    frames = [Frame(file="/usr/lib/python3.11/threading.py", line=320, function="wait"), HOSTILE]
    return write_dumps(folder, [dump(r, history(3) if r == 1 else history(3, op="all_reduce"),
                                     frames=frames if r == 1 else None) for r in range(4)])


def test_a_folder_of_hang_dumps_opens_on_the_hang_page(tmp_path, monkeypatch):
    monkeypatch.setenv("KINETOSCOPE_APP_PATHS", str(skipped_job(tmp_path / "job")))
    at = open_app()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Hang"]
    assert unescaped(at.error[0].value) == (
        "Hang at collective #4 (all_reduce[[4, 3]]) of process group 0: rank 1 never entered it (rank 1 in "
        "**__getitem__** ([x](javascript:alert).py:12))")
    assert {m.label: unescaped(m.value) for m in at.metric} == {
        "Collective": "#4", "Expected op": "all_reduce[[4, 3]]", "Stuck ranks": "1", "Ranks with a dump": "4 of 4"}
    table = at.dataframe[0].value.set_index("rank")
    assert list(table["part"]) == ["waiting", "never entered it", "waiting", "waiting"]
    assert list(table["stuck"]) == [False, True, False, False]
    assert list(table["op there"]) == ["all_reduce", "", "all_reduce", "all_reduce"]  # blank: unknown
    assert list(table["last completed #"]) == [3, 3, 3, 3] and list(table["last entered #"]) == [4, 3, 4, 4]
    # the stuck rank's stack first and open, as code (plain text): every character as written, no markup
    assert at.expander[0].label.startswith("rank 1 (stuck): never entered it")
    assert at.code[0].value == ('File "/usr/lib/python3.11/threading.py", line 320, in wait\n'
                                'File "/home/me/[x](javascript:alert).py", line 12, in **__getitem__**\n'
                                "    ![pixel](https://tracker/p.png) <b>read()</b>")
    assert at.code[1].value.endswith(f'File "{USER}", line 40, in step')  # rank 0, waiting
    assert not any("https://tracker" in m.value and "\\" not in m.value for m in at.markdown)


def test_a_job_with_traces_and_hang_dumps_keeps_every_page(tmp_path, monkeypatch):
    """The last window's trace beside the dumps: the Hang page first, the trace's pages as before."""
    job = write_dumps(tmp_path / "job", [dump(0, history(2, op="all_reduce"), world=1)])
    (job / "trace.json.gz").write_bytes(next((SAMPLES / "cpu" / "healthy").glob("*.pt.trace.json.gz")).read_bytes())
    monkeypatch.setenv("KINETOSCOPE_APP_PATHS", str(job))
    at = open_app()
    assert not at.exception and [t.value for t in at.title] == ["Hang"]
    # one rank, in the middle of #3: every rank of its group (itself) entered it and it never completed
    assert "every rank entered it and it never completed" in unescaped(at.error[0].value)
    at = open_app("overview")
    assert not at.exception and not at.error
    # the overview lists the hang among the findings, critical, beside the trace's own
    assert any(m.value.startswith(":red[**CRITICAL**]") and "Hang at collective #3 (all_reduce[[4, 3]])"
               in unescaped(m.value) for m in at.markdown)


def test_dumps_of_ranks_in_step_say_so_with_no_verdict(tmp_path, monkeypatch):
    job = write_dumps(tmp_path / "job", [dump(r, history(5), reason="SIGUSR1", world=2) for r in range(2)])
    monkeypatch.setenv("KINETOSCOPE_APP_PATHS", str(job))
    at = open_app()
    assert not at.exception and not at.error
    assert unescaped(at.success[0].value).startswith("The 2 dumps show every rank in step")
    assert list(at.dataframe[0].value["part"]) == ["in step", "in step"]


@pytest.mark.slow
def test_the_fleet_lists_hung_jobs_first_and_opens_one_on_the_hang_page(tmp_path, monkeypatch):
    """A store of three jobs: a healthy trace, a job whose ranks hang (dumps alone), and one whose dumps show every
    rank in step. The hung job is listed first, apart, and opens (dumps read in place) on the Hang page."""
    pytest.importorskip("dask")
    from kinetoscope.batch.run import run_batch

    healthy = tmp_path / "traces" / "healthy"
    healthy.mkdir(parents=True)
    (healthy / "trace.json.gz").write_bytes(next((SAMPLES / "cpu" / "healthy").glob("*.pt.trace.json.gz"))
                                            .read_bytes())
    skipped_job(tmp_path / "traces" / "stuck")
    write_dumps(tmp_path / "traces" / "in-step", [dump(r, history(5), reason="SIGUSR1", world=2) for r in range(2)])
    run_batch([tmp_path / "traces"], tmp_path / "store", workers=1)
    monkeypatch.setenv("KINETOSCOPE_APP_PATHS", str(tmp_path / "store"))
    at = open_app("fleet")
    assert not at.exception and not at.error
    assert [s.value for s in at.subheader][0] == "Hung jobs (1)"
    hung = at.dataframe[0].value
    assert list(hung["job"]) == ["stuck"]
    assert (hung["op"].iloc[0], hung["process group"].iloc[0], hung["seq"].iloc[0], hung["stuck ranks"].iloc[0],
            hung["waiting ranks"].iloc[0]) == ("all_reduce[[4, 3]]", "0", 4, "1", "0, 2, 3")
    # the dumps-only jobs are in the sidebar's list too, their dumps read in place
    assert at.selectbox(key="trace").options == ["healthy/trace.json.gz", "in-step", "stuck"]
    at = open_app(fleet_open_job="stuck", fleet_open_page="hang")
    assert not at.exception, at.exception
    assert at.session_state["analysis"].label == "stuck"
    assert [t.value for t in at.title] == ["Hang"]
    assert list(at.dataframe[0].value["part"]) == ["waiting", "never entered it", "waiting", "waiting"]
