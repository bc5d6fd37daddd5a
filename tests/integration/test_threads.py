"""A rank's analyzers run on threads: the report is the one they give one after another, a view asked for by two
threads at once is computed once, and a failing analyzer is reported in its place."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder

from kinetoscope.analyze import registry as registry_module
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.model.trace import trace_view
from kinetoscope.analyze.report import builder as report_module
from kinetoscope.analyze.report.builder import Report, build_report
from kinetoscope.render.json import report_to_json

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = [ROOT / "sample_traces" / "real" / "hta_2rank",
           ROOT / "sample_traces" / "real" / "v100_resnet50_2021.json.gz",
           ROOT / "sample_traces" / "cpu" / "loader_bound"]


def _json(report) -> str:
    return report_to_json(replace(report, timings_s={}))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_the_report_on_threads_is_the_report_one_after_another(path, monkeypatch):
    alone = _json(build_report(load_trace(path), threads=1))
    assert report_module.analysis_threads(4) == 4
    monkeypatch.setattr(report_module, "THREADS_FROM_EVENTS", 0)  # these samples are below it
    assert _json(build_report(load_trace(path), max_threads=4)) == alone


def test_a_view_two_threads_ask_for_at_once_is_computed_once():
    calls = []

    @trace_view
    def slow_view(trace):
        calls.append(threading.get_ident())
        time.sleep(0.2)
        return len(trace.events)

    rank = load_trace(SAMPLES[2]).ranks[0]
    got = []
    threads = [threading.Thread(target=lambda: got.append(slow_view(rank))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == [len(rank.events)] * 3


def test_a_failing_analyzer_on_a_thread_is_reported_and_the_others_kept(monkeypatch):
    monkeypatch.setattr(report_module, "THREADS_FROM_EVENTS", 0)
    real = registry_module.analyzers()
    broken = [replace(a, fn=lambda r, c: 1 / 0) if a.key == "gpu" else a for a in real]
    monkeypatch.setattr(report_module, "analyzers", lambda: broken)
    report = build_report(load_trace(SAMPLES[1]), max_threads=2)
    failures = [(f.analyzer, f.rank, f.error) for f in report.failures]
    assert failures == [("gpu", 0, "ZeroDivisionError: division by zero")]
    assert "loader" in report.timings_s and report.ranks[0]["steps"]["count"] > 0


def test_threads_only_for_ranks_large_enough(monkeypatch):
    """Small ranks' analyzers run one after another: threads would only take the GIL in turns."""
    used = []
    real = report_module.ThreadPoolExecutor

    def spy(max_workers, **kw):
        used.append(max_workers)
        return real(max_workers=max_workers, **kw)

    monkeypatch.setattr(report_module, "ThreadPoolExecutor", spy)
    trace = load_trace(SAMPLES[1])
    build_report(trace, max_threads=3)
    monkeypatch.setattr(report_module, "THREADS_FROM_EVENTS", len(trace.ranks[0].events))
    build_report(trace, max_threads=3)
    assert used == [1, 3]


def test_ctrl_c_drops_the_analyses_not_yet_started(monkeypatch):
    """A KeyboardInterrupt met while the analyzers run ends build_report at once: the queued ones are not waited for."""
    real = registry_module.analyzers()
    started = []

    def slow(r, c):
        started.append(1)
        time.sleep(0.5)

    def interrupted(r, c):
        raise KeyboardInterrupt

    rigged = [replace(a, fn=interrupted if i == 0 else slow)
              for i, a in enumerate(a for a in real if a.scope == "rank")]
    monkeypatch.setattr(report_module, "analyzers", lambda: rigged)
    trace = load_trace(SAMPLES[1])
    began = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        build_report(trace, threads=1)
    assert time.perf_counter() - began < 0.9 and len(started) <= 1  # 8 queued analyzers of 0.5 s each: dropped


def test_an_analysed_trace_can_be_pickled_and_copied():
    """The per-view locks are not carried: a copy starts with none, and its views still compute."""
    import copy
    import pickle

    trace = load_trace(SAMPLES[2])
    before = _json(build_report(trace))
    assert len(trace.ranks[0]._view_locks) > 0
    for twin in (pickle.loads(pickle.dumps(trace)), copy.deepcopy(trace)):
        assert len(twin.ranks[0]._view_locks) == 0
        assert _json(build_report(twin)) == before


@pytest.mark.parametrize("value", ["0", "abc", "-2", "100"])
def test_a_wrong_thread_count_is_a_clear_error(value):
    from kinetoscope.cli.settings import from_environment
    from kinetoscope.errors import ConfigError

    with pytest.raises(ConfigError, match="KINETOSCOPE_THREADS"):
        from_environment({"KINETOSCOPE_THREADS": value})


@pytest.mark.parametrize("value", [0, 65])
def test_a_thread_count_out_of_range_is_refused_by_the_library_too(value):
    from kinetoscope.errors import ConfigError

    with pytest.raises(ConfigError, match="analysis threads"):
        build_report(load_trace(SAMPLES[2]), max_threads=value)


def test_the_library_reads_no_thread_setting_from_the_environment(monkeypatch):
    """KINETOSCOPE_THREADS is the command's (``cli.settings``): the library takes ``max_threads``."""
    monkeypatch.setenv("KINETOSCOPE_THREADS", "abc")  # would be refused if read
    assert build_report(load_trace(SAMPLES[2])).ranks


def test_the_settings_come_from_the_environment_given():
    from pathlib import Path

    from kinetoscope.cli.settings import Settings, default_cache_dir, from_environment
    from kinetoscope.errors import ConfigError

    assert from_environment({}) == Settings(threads=None, decoder="native", cache_dir=None)
    assert from_environment({"KINETOSCOPE_THREADS": " 3 ", "KINETOSCOPE_DECODER": "reference",
                             "KINETOSCOPE_CACHE_DIR": "/c"}) == Settings(3, "reference", Path("/c"))
    with pytest.raises(ConfigError, match="KINETOSCOPE_DECODER"):
        from_environment({"KINETOSCOPE_DECODER": "fast"})
    assert default_cache_dir({"KINETOSCOPE_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/kinetoscope")


def _straggling_job(folder: Path, ranks: int = 5) -> Path:
    """Ranks of 3 steps, an all-reduce each; the last rank arrives 300 us later than the others every time."""
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    folder.mkdir()
    for rank in range(ranks):
        arrive = 400 if rank == ranks - 1 else 100
        b = TraceBuilder(rank=rank, world_size=ranks)
        for step in range(3):
            t = step * 1000
            b.step(step, t, 1000).kernel(t + 10, 80, name="gemm").kernel(t + arrive, 600 - arrive, stream=20, name=nccl)
        b.write(folder / f"rank-{rank}.json")
    return folder


@pytest.fixture(scope="module")
def straggling(tmp_path_factory) -> tuple[Path, Report]:
    """The five-rank straggling job, and its report on one thread with every view kept (built once: the tests below
    compare against it)."""
    job = _straggling_job(tmp_path_factory.mktemp("straggling") / "job")
    return job, build_report(load_trace(job), threads=1)


@pytest.mark.parametrize("threads", [1, 3])
def test_views_dropped_as_ranks_finish_give_the_same_report(straggling, threads):
    """keep_views=False (what the command asks for): the same report, byte for byte; each rank then keeps only what
    the job analyzers reduce over (the straggler's summary), and the straggler is still found."""
    from kinetoscope.analyze.analyzers.straggler import rank_summary

    job, kept = straggling  # on one thread: the report on threads is the same (test above)
    trace = load_trace(job)
    dropped = build_report(trace, threads=threads, keep_views=False)
    assert _json(dropped) == _json(kept)
    assert [f.id for f in dropped.findings if f.id == "straggler"] == ["straggler"]
    assert next(f for f in dropped.findings if f.id == "straggler").rank == 4
    for r in trace.ranks[:-1]:  # the straggler's own views come back for its finding's estimate
        assert list(r._views) == [rank_summary.view_key] and "gpu_events" not in r.__dict__


def test_a_job_analysed_without_views_holds_two_ranks_views_at_a_time(tmp_path, monkeypatch):
    """One thread, RANKS_IN_FLIGHT = 2: when a rank's first analyzer starts, at most one other rank still holds
    views beyond its summary (the rank before it); with keep_views (the default) every earlier rank does."""
    from kinetoscope.analyze.analyzers.straggler import rank_summary

    job = _straggling_job(tmp_path / "job", ranks=6)
    real = registry_module.analyzers()
    first = next(a for a in real if a.scope == "rank")
    seen: list[int] = []

    def recording(trace_of_rank, config):
        seen.append(sum(1 for r in trace.ranks if set(r._views) - {rank_summary.view_key} and r is not trace_of_rank))
        return first.fn(trace_of_rank, config)

    monkeypatch.setattr(report_module, "analyzers", lambda: tuple(replace(a, fn=recording) if a is first else a
                                                                   for a in real))
    trace = load_trace(job)
    build_report(trace, threads=1, keep_views=False)
    assert report_module.RANKS_IN_FLIGHT == 2 and len(seen) == 6 and max(seen) <= 1
    seen.clear()
    trace = load_trace(job)
    build_report(trace, threads=1)
    assert seen == [0, 1, 2, 3, 4, 5]


def test_a_failure_after_a_ranks_estimates_keeps_its_findings_and_is_reported(straggling, monkeypatch):
    """Past the estimates (each caught on its own), a bug in a rank's last work (here dropping its views) loses
    nothing: the rank's findings are listed, unestimated, and the failure is reported as the what-if's."""
    from kinetoscope.analyze.model.trace import RankTrace

    job, kept = straggling

    def broken(self, keep=()):
        raise RuntimeError("drop_views broke")

    monkeypatch.setattr(RankTrace, "drop_views", broken)
    report = build_report(load_trace(job), threads=1, keep_views=False)
    assert sorted((f.id, f.rank) for f in report.findings) == sorted((f.id, f.rank) for f in kept.findings)
    assert [(f.analyzer, f.rank, f.error) for f in report.failures] == \
        [("whatif", r, "RuntimeError: drop_views broke") for r in range(5)]


def test_the_analyze_command_drops_views_and_a_library_caller_keeps_them(monkeypatch, capsys):
    from kinetoscope import cli

    asked = []
    real = report_module.build_report
    monkeypatch.setattr(report_module, "build_report", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    assert cli.main(["analyze", str(SAMPLES[0])]) == 0
    assert [kw.get("keep_views") for kw in asked] == [False]
    assert real.__kwdefaults__["keep_views"] is True


def test_a_per_rank_step_is_a_job_analyzers_trace_view():
    with pytest.raises(ValueError, match="per_rank is a job analyzer's trace_view"):
        registry_module.register("x", "x", scope="job", per_rank=lambda r: r)
    with pytest.raises(ValueError, match="per_rank is a job analyzer's trace_view"):
        registry_module.register("x", "x", scope="rank", per_rank=trace_view(lambda r: r))
    assert "x" not in {a.key for a in registry_module.analyzers()}
