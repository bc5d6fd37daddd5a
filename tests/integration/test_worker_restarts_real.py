"""A real capture's DataLoader worker restarts (issue 28): Lightning's GAN with 16 non-persistent workers over two
epochs (sample_traces/captures/lightning_gan_workers, RUN.md). What is known by construction: two iterators, so two
starts of 16 workers and one restart, inside the window's epoch boundary; what the capture measured is read from its
own files (the manifest, the trace's marks) by this test, never from the report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report

CAPTURE = Path(__file__).resolve().parents[2] / "sample_traces" / "captures" / "lightning_gan_workers"


def _raw() -> tuple[dict, list[dict]]:
    manifest = json.loads((CAPTURE / "rank-0.manifest.json").read_text())
    (trace,) = CAPTURE.glob("*.pt.trace.json.gz")
    return manifest, json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]


def test_the_capture_records_one_restart_of_16_workers():
    manifest, events = _raw()
    workers = manifest["loop"]["workers"]
    assert (workers["starts"], workers["stops"], workers["restarts"]) == (2, 2, 1)
    marks = [e for e in events if e.get("cat") == "kinetoscope" and e["name"].startswith("kinetoscope::workers_")]
    # in the window: the restart, and epoch 0's workers stopping after it (Lightning drops the old iterator late)
    assert [(e["name"], e["args"]["workers"], e["args"]["restart"]) for e in marks] == [
        ("kinetoscope::workers_start", 16, True), ("kinetoscope::workers_stop", 16, True)]
    start, stop = marks
    assert stop["ts"] >= start["ts"] + start["dur"]


def test_worker_respawn_is_the_restart_the_capture_timed():
    manifest, events = _raw()
    rep = build_report(load_trace(CAPTURE))
    (f,) = [x for x in rep.findings if x.id == "worker_respawn"]
    restart_us = manifest["loop"]["workers"]["restart_total_ns"] / 1000
    marks = [e for e in events if e.get("cat") == "kinetoscope" and e["name"].startswith("kinetoscope::workers_")]
    (start,) = [e for e in marks if e["name"] == "kinetoscope::workers_start"]
    (step,) = [int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")
               and e.get("cat") == "user_annotation" and e["ts"] <= start["ts"] < e["ts"] + e["dur"]]
    assert f.evidence["basis"] == "capture (every worker start and stop timed)"
    assert f.worth.one_off_total_us == round(restart_us, 3)
    assert abs(f.impact_us - sum(e["dur"] for e in marks)) < 0.01  # the window's restart: both marks, us rounding
    assert [(r["step"], r["workers"]) for r in f.evidence["window_restarts"]] == [(step, 16)]
    # the run: every step timed, less the one after each window, where the capture exported its trace (this capture
    # predates its timing of its own writing: the manifest's windows say which step that is)
    walls = json.loads((CAPTURE / "rank-0.steps.json").read_text())["step_wall_ns"]
    exports = {w["last_step"] + 1 for w in manifest["windows"] if not w.get("cut_short")}
    assert len(exports) == 1 and all(s < len(walls) for s in exports)
    run_us = sum(w for i, w in enumerate(walls) if i not in exports) / 1000
    assert abs(f.worth.fraction - restart_us / run_us) < 1e-9
    # 605.9 ms of 3.77 s timed: 16.1% of the run, between the policy's 3% and 25%
    assert f.severity == "warning"
