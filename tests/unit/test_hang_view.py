"""The Hang view (analyze/views/hang.py) on dumps built in code: each rank's part, what it entered and completed,
the stacks as text (stuck ranks first), and the Fleet's hung jobs from a ``hangs`` table. Answers known by
construction (tests/hangbuilder.py)."""

from __future__ import annotations

import pandas as pd
from hangbuilder import USER, dump, history

from kinetoscope.analyze.model.trace import Trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.analyze.views.hang import hang_view, hung_first, hung_jobs
from kinetoscope.hangdump import Frame, RaisedException


def view(dumps):
    trace = Trace(source="job", ranks=(), hang_dumps=tuple(dumps))
    return hang_view(trace, build_report(trace))


def test_a_rank_that_entered_a_barrier_is_the_stuck_one_and_the_others_wait():
    """4 ranks (rank 1's dump missing: it left none); #1-#6 completed; at #7 rank 2 entered a barrier, ranks 0 and 3
    all_reduce [[4, 3]], not completed."""
    v = view(dump(r, history(6, op="barrier", sizes=()) if r == 2 else history(6, op="all_reduce")) for r in (0, 2, 3))
    assert v.hung and v.headline["seq"] == 7 and v.headline["stuck_ranks"] == [2]
    assert v.headline["ranks_without_dump"] == [1] and (v.headline["dumps"], v.headline["world_size"]) == (3, 4)
    t = v.ranks.set_index("rank")
    assert list(t["part"]) == ["waiting", "no dump", "entered another collective", "waiting"]
    assert list(t["stuck"]) == [False, False, True, False]
    assert (t.loc[2, "at_seq_op"], t.loc[2, "at_seq_input_sizes"], t.loc[2, "at_seq_state"]) == ("barrier", "[]",
                                                                                                 "scheduled")
    assert (t.loc[0, "at_seq_op"], t.loc[0, "at_seq_input_sizes"], t.loc[0, "at_seq_input_dtypes"]) == (
        "all_reduce", "[[4, 3]]", "Float")
    assert (t.loc[3, "last_entered_seq"], t.loc[3, "last_completed_seq"], t.loc[3, "last_entered_state"]) == (
        7, 6, "scheduled")
    assert t.loc[0, "where"] == "step (train.py:40)" and t.loc[0, "dump_reason"] == "watchdog"
    assert t.loc[1, ["at_seq_op", "last_entered_seq", "dump_reason", "where"]].isna().all()
    assert [s.rank for s in v.stacks] == [2, 0, 3] and [s.stuck for s in v.stacks] == [True, False, False]
    assert v.stacks[0].text == ('File "/usr/lib/python3.11/threading.py", line 320, in wait\n'
                                f'File "{USER}", line 42, in step')
    assert v.stacks[0].label == "rank 2 (stuck): entered another collective; its training thread, innermost frame first"


def test_a_rank_that_raised_shows_its_exception_and_the_frames_it_left_as_text():
    hostile = Frame(file=USER, line=77, function="[click](https://evil)", code="raise ValueError('**bad** <b>')")
    exc = RaisedException(type="ValueError", message="bad batch", frames=[hostile])
    v = view(dump(r, history(3) if r == 0 else history(3, op="all_reduce"), world=2,
                  reason="exception" if r == 0 else "SIGTERM", exc=exc if r == 0 else None) for r in range(2))
    t = v.ranks.set_index("rank")
    assert list(t["part"]) == ["never entered it", "waiting"] and list(t["stuck"]) == [True, False]
    assert v.stacks[0].text == ("ValueError: bad batch\n"
                                f'File "{USER}", line 77, in [click](https://evil)\n'
                                "    raise ValueError('**bad** <b>')")
    assert v.stacks[0].label.endswith("the exception that ended its training thread, innermost frame first")


def test_dumps_of_ranks_in_step_show_their_last_collectives_and_no_verdict():
    v = view(dump(r, history(5), reason="SIGUSR1", world=2) for r in range(2))
    assert not v.hung and v.title is None and v.headline["stuck_ranks"] is None
    t = v.ranks.set_index("rank")
    assert list(t["part"]) == ["in step", "in step"]
    assert (t.loc[1, "last_entered_seq"], t.loc[1, "last_completed_seq"], t.loc[1, "last_entered_state"]) == (
        5, 5, "completed")
    assert t.loc[1, "where"] == "wait (threading.py:320)"  # the innermost frame: no finding picks the user's own


def test_no_dumps_no_view():
    trace = Trace(source="job", ranks=())
    assert hang_view(trace, build_report(trace)) is None


def test_the_fleets_hung_jobs_and_unreadable_dumps_from_a_hangs_table():
    hangs = pd.DataFrame([
        {"key": "k1", "job": "/t/b", "status": "ok", "error": None, "dumps": 4, "hung": True, "process_group": "0",
         "seq": 5, "op": "all_reduce[[1, 3]]", "stuck_ranks": [2], "missing_ranks": [], "mismatched_ranks": [2],
         "waiting_ranks": [0, 1, 3], "ranks_without_dump": [], "cause": "Hang at collective #5"},
        {"key": "k2", "job": "/t/a", "status": "ok", "error": None, "dumps": 2, "hung": False, "process_group": None,
         "seq": None, "op": None, "stuck_ranks": None, "missing_ranks": None, "mismatched_ranks": None,
         "waiting_ranks": None, "ranks_without_dump": None, "cause": None},
        {"key": "k3", "job": "/t/c", "status": "failed", "error": "rank-1.hang.json is pickled", "dumps": 2,
         "hung": None, "process_group": None, "seq": None, "op": None, "stuck_ranks": None, "missing_ranks": None,
         "mismatched_ranks": None, "waiting_ranks": None, "ranks_without_dump": None, "cause": None},
    ])
    names = {"/t/a": "a", "/t/b": "b", "/t/c": "c"}
    hung, unread = hung_jobs(hangs, names)
    assert hung.to_dict("records") == [{"job": "b", "op": "all_reduce[[1, 3]]", "process_group": "0", "seq": 5,
                                        "stuck_ranks": "2", "missing_ranks": "", "mismatched_ranks": "2",
                                        "waiting_ranks": "0, 1, 3", "ranks_without_dump": "", "dumps": 4,
                                        "cause": "Hang at collective #5"}]
    assert unread.to_dict("records") == [{"job": "c", "error": "rank-1.hang.json is pickled"}]
    table = pd.DataFrame({"job": ["a", "c", "b"], "worst_saving_ms_per_step": [9.0, 5.0, 1.0]})
    assert hung_first(table, hung)[["job", "hung"]].values.tolist() == [["b", True], ["a", False], ["c", False]]
