"""Capture: a real CPU training loop through the wrapper and through `kinetoscope capture`."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from kinetoscope import fsutil  # noqa: E402
from kinetoscope.analyze.ingest.loader import load_trace  # noqa: E402
from kinetoscope.analyze.report.builder import build_report  # noqa: E402
from kinetoscope.capture import Profiler, Schedule, profile_loop  # noqa: E402
from kinetoscope.capture import output as capture_output  # noqa: E402
from kinetoscope.capture.telemetry import TelemetrySampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = Schedule(skip_first=0, wait=1, warmup=1, active=2, repeat=1)

pytestmark = pytest.mark.torch


class SlowData(Dataset):
    def __init__(self, n=40, delay_s=0.003):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.randn(16), torch.randn(1)


def train(batches):
    net = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    return steps


@pytest.mark.slow
def test_wrapper_writes_named_gzipped_traces_manifest_and_step_times(tmp_path):
    steps = train(profile_loop(DataLoader(SlowData(), batch_size=4), tmp_path, schedule=SCHEDULE, telemetry=False))
    assert steps == 10
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rank-0.manifest.json", "rank-0.step-2-3.pt.trace.json.gz", "rank-0.steps.json"]
    doc = json.loads(gzip.decompress((tmp_path / "rank-0.step-2-3.pt.trace.json.gz").read_bytes()))
    names = [e.get("name", "") for e in doc["traceEvents"]]
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= set(names)
    assert any(n.startswith("enumerate(DataLoader)#") for n in names)
    assert any(n == "[memory]" for n in names)
    manifest = json.loads((tmp_path / "rank-0.manifest.json").read_text())
    assert manifest["schedule"]["active"] == 2 and manifest["traces"] == ["rank-0.step-2-3.pt.trace.json.gz"]
    assert manifest["versions"]["torch"] == torch.__version__ and manifest["world_size"] == 1
    times = json.loads((tmp_path / "rank-0.steps.json").read_text())
    assert len(times["step_wall_ns"]) == 10 and times["profiled"][2:4] == [True, True]
    assert all(w >= d for w, d in zip(times["step_wall_ns"], times["data_wait_ns"], strict=True))
    # the capture's own trace writing: none before the window ended; the export at the start of the step after it
    busy = times["capture_busy_ns"]
    assert busy[:4] == [0, 0, 0, 0] and 0 < busy[4] <= times["step_wall_ns"][4]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_captured_loader_bound_run_reports_loader_stall(tmp_path):
    train(profile_loop(DataLoader(SlowData(delay_s=0.005), batch_size=4), tmp_path, schedule=SCHEDULE, telemetry=False))
    report = build_report(load_trace(tmp_path))
    assert "loader_stall" in {f.id for f in report.findings}
    run = report.ranks[0]["loader"]["run"]
    # the run's steps less those in which the capture wrote its trace (the export, and its gzip while it ran)
    busy = json.loads((tmp_path / "rank-0.steps.json").read_text())["capture_busy_ns"]
    assert sum(b > 0 for b in busy) >= 1 and run["steps"] == 10 - sum(b > 0 for b in busy)
    assert run["data_wait_fraction"] > 0.5


def test_context_manager_with_step_and_repeat_windows(tmp_path):
    sched = Schedule(skip_first=0, wait=0, warmup=1, active=1, repeat=2)
    with Profiler(tmp_path, schedule=sched, telemetry=False) as prof:
        for _ in range(6):
            torch.randn(8, 8).sum()
            prof.step()
    names = sorted(p.name for p in tmp_path.glob("*.pt.trace.json.gz"))
    assert names == ["rank-0.step-1-1.pt.trace.json.gz", "rank-0.step-3-3.pt.trace.json.gz"]


def test_rank_from_the_launcher_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    train(profile_loop(DataLoader(SlowData(n=24, delay_s=0), batch_size=4), tmp_path, schedule=SCHEDULE,
                       telemetry=False))
    (trace,) = tmp_path.glob("rank-3.step-*.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    assert doc["distributedInfo"]["rank"] == 3 and doc["distributedInfo"]["world_size"] == 4
    assert load_trace(trace).ranks[0].rank == 3


@pytest.mark.slow
def test_zero_code_capture_of_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 40\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.004); return torch.randn(16), torch.randn(1)\n"
        "net = torch.nn.Linear(16, 1); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(D(), batch_size=4):\n"
        "    loss = torch.nn.functional.mse_loss(net(x), y); opt.zero_grad(); loss.backward(); opt.step()\n"
        "print('done training')\n"
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), "--skip-first", "1", "--wait", "0",
         "--warmup", "1", "--active", "3", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "done training" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "rank-0.manifest.json", "rank-0.step-2-4.pt.trace.json.gz", "rank-0.steps.json"]
    report = build_report(load_trace(out))
    assert report.ranks[0]["steps"]["count"] == 3
    assert "loader_stall" in {f.id for f in report.findings}
    times = json.loads((out / "rank-0.steps.json").read_text())
    # all 10 iterations are steps: the first DataLoader iteration starts the profiler (then the optimizer ends steps)
    assert len(times["step_wall_ns"]) == 10 and sum(times["data_wait_ns"]) > 0


def test_capture_without_a_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--"], capture_output=True, text=True)
    assert proc.returncode == 2 and "needs a command" in proc.stderr and "Traceback" not in proc.stderr


# --- faults: the training loop always finishes ---------------------------------------------
def test_unwritable_output_directory_leaves_training_running(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="kinetoscope.capture"):
        steps = train(profile_loop(DataLoader(SlowData(delay_s=0), batch_size=4), blocker / "out", schedule=SCHEDULE))
    assert steps == 10
    assert "cannot write" in caplog.text


def test_telemetry_sampler_failure_leaves_training_running(tmp_path, monkeypatch, caplog):
    def broken(self):
        raise RuntimeError("NVML exploded")

    monkeypatch.setattr(TelemetrySampler, "start", broken)
    with caplog.at_level(logging.WARNING, logger="kinetoscope.capture"):
        steps = train(profile_loop(DataLoader(SlowData(delay_s=0), batch_size=4), tmp_path, schedule=SCHEDULE))
    assert steps == 10 and "NVML exploded" in caplog.text
    assert list(tmp_path.glob("*.pt.trace.json.gz"))


def test_full_disk_during_export_leaves_training_running(tmp_path, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kinetoscope.capture.output.finish_trace", full)
    with caplog.at_level(logging.WARNING, logger="kinetoscope.capture"):
        steps = train(profile_loop(DataLoader(SlowData(delay_s=0), batch_size=4), tmp_path, schedule=SCHEDULE,
                                   telemetry=False))
    assert steps == 10 and "No space left" in caplog.text


def test_profiler_failing_mid_run_leaves_training_running(tmp_path, caplog):
    prof = Profiler(tmp_path, schedule=SCHEDULE, telemetry=False)
    prof.start()

    class Exploding:
        def step(self):
            raise RuntimeError("kineto crashed")

        def stop(self):
            raise RuntimeError("and again")

    prof._prof = Exploding()
    with caplog.at_level(logging.WARNING, logger="kinetoscope.capture"):
        for _ in range(5):
            prof.step()
        prof.stop()
    assert "kineto crashed" in caplog.text
    assert (tmp_path / "rank-0.steps.json").exists()


def test_atomic_write_never_leaves_partial_files(tmp_path, monkeypatch):
    target = tmp_path / "x.json.gz"

    class Boom(Exception):
        pass

    def explode(*a, **k):
        raise Boom()

    monkeypatch.setattr(fsutil.os, "replace", explode)
    with pytest.raises(Boom):
        capture_output.atomic_write(target, b"data")
    assert list(tmp_path.iterdir()) == []


def test_nvml_indices_follow_cuda_visible_devices(monkeypatch):
    from kinetoscope.capture.telemetry import visible_nvml_handles

    class FakeNvml:
        def nvmlDeviceGetCount(self):
            return 4

        def nvmlDeviceGetHandleByIndex(self, i):
            return f"nvml{i}"

        def nvmlDeviceGetHandleByUUID(self, uuid):
            return f"uuid:{uuid}"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_nvml_handles(FakeNvml()) == [(0, "nvml2"), (1, "nvml0")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert visible_nvml_handles(FakeNvml()) == [(0, "uuid:GPU-abc")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,9,2")
    assert visible_nvml_handles(FakeNvml()) == [(0, "nvml1")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert len(visible_nvml_handles(FakeNvml())) == 4


def test_telemetry_samples_become_counter_events_on_the_trace_clock():
    from kinetoscope.capture.telemetry import Sample

    s = TelemetrySampler()
    s.samples = [Sample(1_000_000_500_000, 0, {"gpu_util_pct": 50.0}), Sample(5, 0, {"gpu_util_pct": 1.0})]
    events = s.counter_events(base_time_ns=1_000_000_000_000, start_unix_ns=100, end_unix_ns=2_000_000_000_000)
    assert events == [{"ph": "C", "name": "GPU 0 telemetry", "pid": "GPU 0", "tid": 0, "ts": 500.0,
                       "args": {"gpu_util_pct": 50.0}}]


def test_capture_side_does_not_import_streamlit_or_dask():
    code = ("import sys, kinetoscope.capture; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('streamlit', 'dask', 'pandas', 'hta')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_analyze_side_does_not_import_torch():
    code = ("import sys, kinetoscope.analyze.report.builder, kinetoscope.analyze.ingest.loader, "
            "kinetoscope.analyze.registry as r; "
            "r.analyzers(); sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.slow
def test_capture_under_torchrun_writes_one_trace_per_rank(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(
        "import time, torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\n"
        "rank = dist.get_rank()\n"
        "net = DDP(torch.nn.Linear(64, 1)); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for i in range(9):\n"
        "    if rank == 1: time.sleep(0.01)\n"
        "    loss = net(torch.randn(32, 64)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "dist.destroy_process_group()\n"
    )
    out = tmp_path / "out"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533"]
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), "--", *torchrun,
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    traces = sorted(p.name for p in out.glob("*.pt.trace.json.gz"))
    assert traces == ["rank-0.step-3-5.pt.trace.json.gz", "rank-1.step-3-5.pt.trace.json.gz"]
    trace = load_trace(out)
    assert [r.rank for r in trace.ranks] == [0, 1]
    assert all(r.meta.rank_source == "distributedInfo" and r.meta.world_size == 2 for r in trace.ranks)
    # torchrun said how many of the job's ranks run on this host: they share its CPUs
    hosts = [json.loads((out / f"rank-{r}.manifest.json").read_text())["host"] for r in (0, 1)]
    assert [h["ranks_on_host"] for h in hosts] == [2, 2]
    report = build_report(trace)
    stragglers = [f for f in report.findings if f.id == "straggler"]
    assert [f.rank for f in stragglers] == [1]
    # a CPU (gloo) DDP run records its all-reduces on the host only: the text report still shows them
    from kinetoscope.render.text import render_text

    assert render_text(report).count("communication  3 collectives, ") == 2  # gloo: overlap with the CPU compute


def test_sigterm_mid_write_leaves_no_file_under_the_final_name(tmp_path):
    """A process killed while writing a trace leaves only a hidden temporary file, never a corrupt trace."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from kinetoscope import fsutil\n"
        "import builtins\n"
        "real = builtins.open\n"
        "class Slow:\n"
        "    def __init__(self, fh): self.fh = fh\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *a): self.fh.close()\n"
        "    def write(self, data):\n"
        "        for i in range(0, len(data), 4096):\n"
        "            self.fh.write(data[i:i + 4096]); self.fh.flush(); time.sleep(0.01)\n"
        "fsutil.open = lambda path, mode: Slow(real(path, mode))\n"
        "print('writing', flush=True)\n"
        "fsutil.atomic_write(Path(sys.argv[1]), b'x' * 4096 * 1000)\n"
    )
    target = tmp_path / "rank-0.step-1-3.pt.trace.json.gz"
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(0.5)
    proc.terminate()
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert not target.exists()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert all(name.startswith(".") and name.endswith(".tmp") for name in leftovers) and leftovers


def test_telemetry_samples_land_in_the_trace_and_the_report(tmp_path, monkeypatch):
    """NVML is absent here: a fake sampler stands in, the merge into the trace and the analysis are real."""
    from kinetoscope.capture.telemetry import Sample

    def fake_start(self):
        self.enabled = True
        return True

    def fake_counter_events(self, base_time_ns, start_unix_ns, end_unix_ns):
        self.samples = [Sample(end_unix_ns - 100_000 * k, 0, {"gpu_util_pct": 80.0 + k, "power_w": 250.0})
                        for k in range(5)]
        return TelemetrySampler.__dict__["_real_counter_events"](self, base_time_ns, start_unix_ns, end_unix_ns)

    monkeypatch.setattr(TelemetrySampler, "_real_counter_events", TelemetrySampler.counter_events, raising=False)
    monkeypatch.setattr(TelemetrySampler, "start", fake_start)
    monkeypatch.setattr(TelemetrySampler, "counter_events", fake_counter_events)
    train(profile_loop(DataLoader(SlowData(delay_s=0.002), batch_size=4), tmp_path, schedule=SCHEDULE))
    (trace,) = tmp_path.glob("*.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    counters = [e for e in doc["traceEvents"] if e.get("ph") == "C"]
    assert len(counters) == 5 and counters[0]["name"] == "GPU 0 telemetry"
    report = build_report(load_trace(tmp_path))
    tel = report.ranks[0]["telemetry"]["GPU 0 telemetry"]
    assert tel["power_w"]["mean"] == 250.0


def test_effective_cores_is_all_threads_throughput_over_one_threads(monkeypatch):
    """The probe's arithmetic, with the hashing replaced by known counts: one thread hashes 100 blocks in a phase;
    two together 175 (cores that share a physical core) -> 1.75 cores; more than the CPU count is not believed."""
    from kinetoscope.capture import cores

    monkeypatch.setattr(cores, "_alone", lambda seconds: 100)
    monkeypatch.setattr(cores, "_together", lambda threads, seconds: 175)
    assert cores.effective_cores(2) == 1.75
    monkeypatch.setattr(cores, "_together", lambda threads, seconds: 260)
    assert cores.effective_cores(2) == 2.0
    assert cores.effective_cores(1) is None and cores.effective_cores(None) is None


def test_effective_cores_of_a_host_larger_than_the_thread_cap(monkeypatch):
    """On 128 CPUs the probe runs 64 threads; at 0.9 of one thread's throughput each (57.6 threads' worth), the 128
    CPUs do 115.2 cores' work."""
    from kinetoscope.capture import cores

    started = []
    monkeypatch.setattr(cores, "_alone", lambda seconds: 100)
    monkeypatch.setattr(cores, "_together", lambda threads, seconds: started.append(threads) or threads * 90)
    assert cores.effective_cores(128) == 115.2 and started == [cores.MAX_THREADS] * 2
    assert cores.effective_cores(4) == 3.6 and started[-1] == 4


def test_the_real_probe_counts_only_what_each_thread_hashed_inside_one_window():
    """16 threads on this machine's few CPUs: the threads that get a CPU late count only what they finish inside
    the window the last one opened, so together they never count more than the CPUs can do (a thread's own window,
    started whenever it got a CPU, counted 3.6 cores' work on 2 CPUs)."""
    from kinetoscope.capture import cores

    # one thread's rate is the best of five windows: on a shared machine a single 20 ms window can lose most of its
    # CPU to other work (the full suite once measured 18 against 16 threads' 102, and failed), which says nothing
    # about the probe; the best of five is what one CPU does, so 16 threads still cannot count more than CPUs x that
    one = max(cores._alone(0.02) for _ in range(5))
    many = cores._together(16, 0.02)
    assert many <= one * len(os.sched_getaffinity(0)) * 1.3, (one, many)


def test_a_probe_thread_that_cannot_start_leaves_none_waiting(monkeypatch):
    from kinetoscope.capture import cores

    real_start, calls = cores.threading.Thread.start, []

    def start(self):
        calls.append(self)
        if len(calls) == 2:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(cores.threading.Thread, "start", start)
    t = time.perf_counter()
    with pytest.raises(RuntimeError):
        cores._together(4, 0.02)
    assert time.perf_counter() - t < 2 and not calls[0].is_alive()  # the started one was released, not left waiting


def test_the_manifest_records_the_memory_the_process_may_use(monkeypatch, tmp_path):
    """The host's memory and the cgroup's limit where lower go into the manifest's ``host``, what CPU memory growth is
    judged against; where the platform says neither, both are null (not 0)."""
    from kinetoscope.capture import hostmem, profiler
    from kinetoscope.capture.dist import RankInfo

    def host():
        out = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        p = profiler.Profiler(out)
        p.out_dir.mkdir()
        p.rank = RankInfo(0, 2, 0, "environment")  # a job's rank: no cores probe
        p._write_sidecars()
        return json.loads((out / "rank-0.manifest.json").read_text())["host"]

    monkeypatch.setattr(hostmem, "physical_memory_bytes", lambda: 16 << 30)
    monkeypatch.setattr(hostmem, "cgroup_memory_limit_bytes", lambda: 4 << 30)
    got = host()
    assert (got["memory_bytes"], got["memory_limit_bytes"]) == (16 << 30, 4 << 30)
    monkeypatch.setattr(hostmem, "cgroup_memory_limit_bytes", lambda: 32 << 30)  # above the host's: no limit
    got = host()
    assert (got["memory_bytes"], got["memory_limit_bytes"]) == (16 << 30, None)
    monkeypatch.setattr(hostmem, "physical_memory_bytes", lambda: None)
    monkeypatch.setattr(hostmem, "cgroup_memory_limit_bytes", lambda: None)
    got = host()
    assert (got["memory_bytes"], got["memory_limit_bytes"]) == (None, None)


def test_the_cores_probe_runs_only_in_a_job_of_one_process_that_ends_normally(monkeypatch, tmp_path):
    """The ranks of a job end together: each would measure the others' probes, so none probes; nor does a run
    ending early (a signal, a crash), which should go at once. A probe that fails, or is interrupted, leaves the
    manifest written without it."""
    from kinetoscope.capture import profiler
    from kinetoscope.capture.dist import RankInfo

    def host(world_size, ended_by, probe=lambda cpus: 1.5):
        monkeypatch.setattr(profiler, "effective_cores", probe)
        out = tmp_path / f"{world_size}-{ended_by}-{len(list(tmp_path.iterdir()))}"
        p = profiler.Profiler(out)
        p.out_dir.mkdir()
        p.rank = RankInfo(0, world_size, 0, "environment")
        p._ended_by = ended_by
        try:
            p._write_sidecars()
        finally:
            manifest = json.loads((out / "rank-0.manifest.json").read_text())
        assert manifest["steps_run"] == 0 and manifest["host"]["cpus"] >= 1
        return manifest["host"]

    assert host(1, None)["cores_effective"] == 1.5
    assert host(8, None)["cores_effective"] is None
    assert host(1, "SIGTERM")["cores_effective"] is None

    def broken(cpus):
        raise RuntimeError("can't start new thread")

    assert host(1, None, broken)["cores_effective"] is None

    def interrupted(cpus):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not swallowed: the script's own Ctrl-C handling still sees it
        host(1, None, interrupted)


def test_a_loop_loading_in_process_gets_the_hand_over_measured(tmp_path):
    """num_workers=0: at the end the capture times one forked worker handing over batches shaped like the loop's
    (4 x 16 and 4 x 1 float32: 272 bytes), 20 of them; the probe's loader and worker are not the training's (the
    loop recorded one loader, no worker started). With workers too: the trace's waits hold the hand-over and the
    workers' lateness together, and only a ready batch tells them apart; the probe's worker is not counted as the
    training's (one worker started, the loader's own)."""
    train(profile_loop(DataLoader(SlowData(delay_s=0.0005), batch_size=4), tmp_path / "inline",
                       schedule=SCHEDULE, telemetry=False))
    manifest = json.loads((tmp_path / "inline" / "rank-0.manifest.json").read_text())
    probe = manifest["dataloader"]["handover_probe"]
    assert probe["samples"] == 20 and probe["batch_bytes"] == 272 and probe["workers"] == 1 and probe["why"] is None
    assert probe["median_ns"] > 0
    assert [loader["role"] for loader in manifest["loop"]["loaders"]] == ["train"]
    assert manifest["loop"]["child_processes"]["dataloader_workers"] == 0
    facts = load_trace(tmp_path / "inline").ranks[0].meta.capture["dataloader"]
    assert facts["handover_probe"] == probe and facts["num_workers"] == 0

    train(profile_loop(DataLoader(SlowData(delay_s=0.0005), batch_size=4, num_workers=1), tmp_path / "workers",
                       schedule=SCHEDULE, telemetry=False))
    manifest = json.loads((tmp_path / "workers" / "rank-0.manifest.json").read_text())
    probe = manifest["dataloader"]["handover_probe"]
    assert manifest["dataloader"]["num_workers"] == 1
    assert probe["samples"] == 20 and probe["batch_bytes"] == 272 and probe["workers"] == 1 and probe["why"] is None
    assert [loader["role"] for loader in manifest["loop"]["loaders"]] == ["train"]
    assert manifest["loop"]["child_processes"]["dataloader_workers"] == 1


def test_a_probe_with_odd_numbers_is_dropped_and_the_loader_kept(tmp_path):
    from kinetoscope.analyze.ingest.loader import _dataloader_facts

    dl = {"num_workers": 0, "batch_size": 4, "handover_probe": {"median_ns": "1e6", "samples": 20}}
    assert _dataloader_facts(dl) == {"num_workers": 0, "batch_size": 4}
    dl["handover_probe"] = {"median_ns": 900_000, "samples": 20, "why": 3}
    assert _dataloader_facts(dl)["handover_probe"] == {"median_ns": 900_000, "p10_ns": None, "p90_ns": None,
                                                       "samples": 20, "batch_bytes": None, "workers": None,
                                                       "why": None}
