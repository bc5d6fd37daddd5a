"""Pipeline stages on a real capture: two gloo ranks running torch.distributed.pipelining's GPipe, stage 1 three
times stage 0's work (sample_traces/captures/pipeline_gpipe_gloo/RUN.md). What the run makes true: rank 0 is the
first stage and sends to rank 1, the last; stage 0 waits for stage 1 more than the reverse. The bubble's intervals
are checked against the raw events, read here apart from the loader: each lies inside gloo:send/recv spans and
beside no aten op."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

CAPTURE = Path(__file__).resolve().parents[2] / "sample_traces" / "captures" / "pipeline_gpipe_gloo"


@pytest.fixture(scope="module")
def report():
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report

    return build_report(load_trace(CAPTURE))


def _raw(rank: int) -> list[dict]:
    (path,) = CAPTURE.glob(f"rank-{rank}.*.pt.trace.json.gz")
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_the_stages_their_order_and_their_neighbours(report):
    from kinetoscope.analyze.views.distributed import stages_table

    first, last = (rr["comm_roles"]["pipeline"] for rr in report.ranks)
    assert (first["where"], first["peers"], first["upstream_rank"], first["downstream_rank"]) == ("host", [1], None, 1)
    assert (last["where"], last["peers"], last["upstream_rank"], last["downstream_rank"]) == ("host", [0], 0, None)
    # 4 microbatches a step, each sent and its gradient sent back: 8 send/recv a step on each rank, 3 steps
    assert first["p2p_ops"] == last["p2p_ops"] == 24 and len(first["steps"]) == len(last["steps"]) == 3
    table = stages_table(report)
    assert list(table["stage"]) == [0, 1] and list(table["rank"]) == [0, 1]
    # the light first stage waits for the heavy last one
    assert first["bubble_fraction"] > last["bubble_fraction"]
    assert first["worth_us_per_step"] is None  # the replay holds no host send/recv


@pytest.mark.parametrize("rank", [0, 1])
def test_every_bubble_interval_is_in_sends_or_recvs_and_beside_no_aten_op(report, rank):
    events = [e for e in _raw(rank) if e.get("ph") == "X"]
    steps = {int(e["name"].split("#")[1]): e["ts"] for e in events if str(e["name"]).startswith("ProfilerStep#")}
    p2p: list[list[float]] = []  # the gloo:send/recv spans, merged where they overlap
    for a, b in sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] in ("gloo:send", "gloo:recv")):
        if p2p and a <= p2p[-1][1]:
            p2p[-1][1] = max(p2p[-1][1], b)
        else:
            p2p.append([a, b])
    aten = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e["name"]).startswith("aten::")]
    block = report.ranks[rank]["comm_roles"]["pipeline"]
    tol = 0.002  # us: the report rounds to the ns
    for step in block["steps"]:
        assert step["intervals_left_out"] == 0 and 0 < step["bubble_us"] <= step["step_us"]
        assert step["bubble_us"] == pytest.approx(sum(b - a for a, b in step["intervals_us"]), abs=0.01)
        for a, b in step["intervals_us"]:
            lo, hi = steps[step["step"]] + a, steps[step["step"]] + b
            assert 0 <= a < b <= step["step_us"] + tol
            assert any(s - tol <= lo and hi <= e + tol for s, e in p2p), (rank, step["step"], a, b)
            assert not any(s < hi - tol and lo + tol < e for s, e in aten), (rank, step["step"], a, b)


def test_the_first_stage_s_bubble_is_a_finding(report):
    found = {f.rank: f for f in report.findings if f.id == "pipeline_bubble"}
    assert found[0].evidence["where"] == "host" and found[0].evidence["downstream_rank"] == 1
    # its worth is the measured bubble, a bound (no replay of host send/recv)
    assert found[0].worth.basis == "upper bound"
    assert found[0].estimate["saving_us_per_step"] == report.ranks[0]["comm_roles"]["pipeline"]["bubble_us_per_step"]
