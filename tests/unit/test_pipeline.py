"""Issue 31 item 3: pipeline bubbles per stage, on GPipe and 1F1B jobs built so every stage's waits are known by
construction (``tracebuilder.pipeline_job``: 100 us forwards, 200 us backwards, transfers that take no time, the GPU
starting 100 us into each step).

With p stages, m microbatches and equal stage times, each stage waits (p - 1) x 300 us a step (GPipe's and 1F1B's
bubble alike) beside m x 300 us of compute: (p - 1) / (m + p - 1) of the schedule. A step spans the schedule and the
100 us before the GPU starts."""

from __future__ import annotations

import pytest
from conftest import load_built
from tracebuilder import pipeline_job

from kinetoscope.analyze.whatif.commroles import comm_roles_entry


def _stages(tmp_path, **job):
    out = []
    for s, b in enumerate(pipeline_job(**job)):
        block = comm_roles_entry(load_built(tmp_path, b, f"rank-{s}.json").ranks[0])
        assert block is not None and block.pipeline is not None
        out.append(block.pipeline)
    return out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_four_stages_eight_microbatches_wait_three_stage_times_a_step(tmp_path, schedule):
    stages = _stages(tmp_path, stages=4, micro=8, schedule=schedule)
    for s, st in enumerate(stages):
        assert st.where == "gpu" and st.bubble_unknown is None and len(st.steps) == 3
        # neighbours from the two-rank groups; the first stage receives from none, the last sends to none downstream
        assert st.peers == [p for p in (s - 1, s + 1) if 0 <= p < 4]
        assert st.upstream_rank == (s - 1 if s > 0 else None)
        assert st.downstream_rank == (s + 1 if s < 3 else None)
        for step in st.steps:
            # a step: 100 us before the GPU starts, then (8 + 3) x 300 us
            assert (step.step_us, step.bubble_us, step.intervals_left_out) == (3400.0, 900.0, 0)
            assert step.bubble_fraction == 900 / 3400
        assert st.bubble_us_per_step == 900.0 and st.bubble_fraction == 900 / 3400
        # of the schedule alone (the step less the 100 us): (p - 1) / (m + p - 1)
        assert st.bubble_us_per_step / (3400 - 100) == 3 / 11


def test_gpipe_s_bubbles_where_they_fall_in_the_step(tmp_path):
    """GPipe, 4 stages: stage s's forwards run from 100 + 100 s (the GPU starts at 100), stage 0's last backward ends
    the step. Stage 0 waits from the end of its forwards (+900) for the first gradient (+1800); stage s > 0 waits
    300 s - 1 for its first activation (the 1 us its last send ran at the end of the step before fills the rest:
    300 s of the previous cool-down and this warm-up in all), then 300 (3 - s) for its first gradient, and its
    last send (1 us) ends the step."""
    stages = _stages(tmp_path, stages=4, micro=8, schedule="gpipe")
    assert [st.steps[1].intervals_us for st in stages] == [
        [[900.0, 1800.0]],
        [[100.0, 399.0], [1199.0, 1799.0], [3399.0, 3400.0]],
        [[100.0, 699.0], [1499.0, 1799.0], [3399.0, 3400.0]],
        [[100.0, 999.0], [3399.0, 3400.0]],
    ]
    # the replay with the stage's send/recv taking no time: its compute back to back, 100 + 8 x 300 = 2500 us a step;
    # a stage that waited after the step's first kernel resumes after the replay's 1 us between back-to-back kernels
    # of a stream (graph.STREAM_GAP_NS): 900 - 1 but for the last stage, which waits only before its first
    assert [st.worth_us_per_step for st in stages] == [899.0, 899.0, 899.0, 900.0]


def test_one_f_one_b_spreads_the_same_bubble_over_the_steady_state(tmp_path):
    """1F1B, 4 stages: stage 0 runs 3 forwards of warm-up (+100..+400), a fourth (+400..+500), then waits for the
    first gradient (+1100) and, in the cool-down, 100 us before each of the last three backwards."""
    stages = _stages(tmp_path, stages=4, micro=8, schedule="1f1b")
    assert stages[0].steps[0].intervals_us == [[500.0, 1100.0], [2500.0, 2600.0], [2800.0, 2900.0], [3100.0, 3200.0]]
    # each wait after the step's first kernel costs the replay's 1 us gap: 4, 3, 2 and 0 of them
    assert [st.worth_us_per_step for st in stages] == [896.0, 897.0, 898.0, 900.0]


@pytest.mark.parametrize(("schedule", "first_stage"), [("gpipe", [[500.0, 800.0]]),
                                                       ("1f1b", [[300.0, 500.0], [1300.0, 1400.0]])])
def test_two_stages_four_microbatches(tmp_path, schedule, first_stage):
    """2 stages, 4 microbatches: 300 us of bubble a stage in a 100 + 5 x 300 us step, 1 / 5 of the schedule."""
    first, last = _stages(tmp_path, stages=2, micro=4, schedule=schedule)
    assert (first.upstream_rank, first.downstream_rank, last.upstream_rank, last.downstream_rank) == (None, 1, 0, None)
    assert first.bubble_us_per_step == last.bubble_us_per_step == 300.0
    assert first.bubble_fraction == 300 / 1600 and 300 / (1600 - 100) == 1 / 5
    assert first.steps[2].intervals_us == first_stage
    assert last.steps[2].intervals_us == [[100.0, 399.0], [1599.0, 1600.0]]


def test_a_rank_without_send_or_recv_is_no_stage_and_the_report_holds_the_block(tmp_path):
    from tracebuilder import ddp_step

    block = comm_roles_entry(load_built(tmp_path, ddp_step()).ranks[0])
    assert block is not None and block.pipeline is None and block.to_dict()["pipeline"] is None


def test_stage_order_follows_who_receives_from_whom():
    from kinetoscope.analyze.views.distributed import stage_order

    # ranks 4 -> 0 -> 7 -> 2 (rank order is not stage order)
    assert stage_order({0: (4, 7), 2: (7, None), 4: (None, 0), 7: (0, 2)}) == {0: 1, 2: 3, 4: 0, 7: 2}
    # interleaved stages make a cycle: nothing starts it, no order
    assert stage_order({0: (1, 1), 1: (0, 0)}) == {0: None, 1: None}
    # a link one side does not confirm ends the chain there
    assert stage_order({0: (None, 1), 1: (5, 2), 2: (1, None)}) == {0: 0, 1: None, 2: None}


def test_the_distributed_view_shows_a_row_per_stage_in_stage_order(tmp_path):
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.analyze.views.distributed import stages_table

    for s, b in enumerate(pipeline_job(stages=4, micro=8, schedule="gpipe")):
        b.write(tmp_path / "job" / f"rank-{s}.json")
    report = build_report(load_trace(tmp_path / "job"))
    assert report.ranks[2]["comm_roles"]["pipeline"]["upstream_rank"] == 1
    table = stages_table(report)
    assert list(table["stage"]) == [0, 1, 2, 3] and list(table["rank"]) == [0, 1, 2, 3]
    assert list(table["bubble_ms"]) == [0.9] * 4 and list(table["step_ms"]) == [3.4] * 4
    assert list(table["worth_ms"]) == [0.899, 0.899, 0.899, 0.9]
    assert list(table["upstream_rank"].astype(object).fillna(-1)) == [-1, 0, 1, 2]


def test_each_stage_s_bubble_is_a_finding_worth_what_the_replay_says(tmp_path):
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report

    for s, b in enumerate(pipeline_job(stages=4, micro=8, schedule="gpipe")):
        b.write(tmp_path / "job" / f"rank-{s}.json")
    report = build_report(load_trace(tmp_path / "job"))
    bubbles = {f.rank: f for f in report.findings if f.id == "pipeline_bubble"}
    assert sorted(bubbles) == [0, 1, 2, 3]
    first, last = bubbles[0], bubbles[3]
    assert first.title == "Pipeline stage (first stage, sends to rank 1) waits for its neighbours 26% of each step " \
                          "(0.90 ms of 3.40 ms)"
    assert last.title.startswith("Pipeline stage (receives from rank 2, last stage) waits")
    assert first.evidence["bubble_us_by_step"] == {"0": 900.0, "1": 900.0, "2": 900.0}
    assert first.impact_us == 2700.0  # three steps' bubbles
    # the replay with the send/recv kernels taking no time (the comm_roles block's worth): 899 and 900 us a step,
    # an upper bound, so credited at half: 899 / 3400 = 26%, 13% credited: a warning
    assert (first.estimate["saving_us_per_step"], last.estimate["saving_us_per_step"]) == (899.0, 900.0)
    assert first.estimate["bound"] == "upper" and first.worth.basis == "upper bound"
    assert first.severity == "warning"


def test_no_finding_where_the_bubble_is_small_or_no_neighbour_is_known(tmp_path):
    from kinetoscope.analyze.analyzers.comm import analyze_comm
    from kinetoscope.analyze.model.config import DEFAULT_CONFIG

    def bubble_findings(name, **job):
        r = load_built(tmp_path, pipeline_job(**job)[0], f"{name}.json").ranks[0]
        return [f for f in analyze_comm(r, DEFAULT_CONFIG).findings if f.id == "pipeline_bubble"]

    assert len(bubble_findings("a", stages=2, micro=4)) == 1  # 300 us of 1600: 19%
    # 2 stages, 32 microbatches (250 us to launch their kernels): 300 us of 250 + 33 x 300 = 10150 us, 3% of the
    # step: under the 5% bar
    assert bubble_findings("b", stages=2, micro=32, host_us=250.0) == []
    # one group of all three ranks names no peer: send/recv to no known neighbour are no evidence of stages
    assert bubble_findings("c", stages=3, micro=4, world_group=True) == []


def gloo_stage(rank: int, world: int, up: int | None, down: int | None, *, one_group: bool = True,
               shapes: bool = True):
    """One 1000 us step of a stage on gloo/CPU, as torch.distributed.pipelining records it (a real 2-rank capture:
    c10d::send / c10d::recv_ ops, each followed by a gloo:send / gloo:recv annotation on the training thread that
    lasts until the transfer is done; a send waited for later, a recv at once). Two forwards (+10..+110,
    +120..+220), each sent on (sends +115..+300 and +225..+500: the thread has nothing left to do from +220); the
    first gradient's recv +515..+800, a backward +800..+900, the second's recv +905..+910, a backward +910..+990.
    ``up``/``down``: the ranks the c10d ops name (their third argument, recorded with record_shapes)."""
    from tracebuilder import TraceBuilder

    b = TraceBuilder(rank=rank, world_size=world)
    if one_group:
        b.top["distributedInfo"]["pg_count"] = 1
    t = 10_000

    def c10d(name, at, peer):
        args = {"Input Dims": [[[16, 256]], [], [], []], "Concrete Inputs": ["", "", str(peer), "0"]} \
            if shapes else {}
        b.op(name, at, 5, **args)

    b.step(0, t, 1000)
    b.op("aten::mm", t + 10, 100)
    c10d("c10d::send", t + 110, down)
    b.op("gloo:send", t + 115, 185, cat="user_annotation")
    b.op("aten::mm", t + 120, 100)
    c10d("c10d::send", t + 220, down)
    b.op("gloo:send", t + 225, 275, cat="user_annotation")
    c10d("c10d::recv_", t + 510, down)
    b.op("gloo:recv", t + 515, 285, cat="user_annotation")
    b.op("aten::mm", t + 800, 100)
    c10d("c10d::recv_", t + 900, down)
    b.op("gloo:recv", t + 905, 5, cat="user_annotation")
    b.op("aten::mm", t + 910, 80)
    if up is not None:  # a later stage first receives its activations
        c10d("c10d::recv_", t + 1, up)
        b.op("gloo:recv", t + 3, 6, cat="user_annotation")
    return b


def test_on_gloo_the_stage_waits_in_recv_and_in_the_sends_after_its_last_compute(tmp_path):
    block = comm_roles_entry(load_built(tmp_path, gloo_stage(0, 2, None, 1)).ranks[0]).pipeline
    assert block.where == "host" and block.bubble_unknown is None
    # two ranks: the peer is the other one; the first op of the step is a send: the first stage
    assert (block.peers, block.upstream_rank, block.downstream_rank) == ([1], None, 1)
    # sends: +220..+300 (after the second forward) and +225..+500 (nothing after it): +220..+500; recvs +515..+800 and
    # +905..+910; the gaps between ops (+110..+120, +500..+515) are not waits
    (step,) = block.steps
    assert step.intervals_us == [[220.0, 500.0], [515.0, 800.0], [905.0, 910.0]]
    assert (step.bubble_us, block.bubble_us_per_step, block.bubble_fraction) == (570.0, 570.0, 0.57)
    assert block.worth_us_per_step is None and "not replayed" in block.worth_of


def test_on_gloo_the_peers_come_from_the_c10d_ops_where_the_job_had_one_group(tmp_path):
    def stage(name, **kw):
        return comm_roles_entry(load_built(tmp_path, gloo_stage(1, 3, 0, 2, **kw), f"{name}.json").ranks[0]).pipeline

    middle = stage("a")
    assert (middle.peers, middle.upstream_rank, middle.downstream_rank) == ([0, 2], 0, 2)
    # several process groups: the c10d op's rank is one in its group, which the trace does not name
    assert (stage("b", one_group=False).peers, stage("c", shapes=False).upstream_rank) == ([], None)
