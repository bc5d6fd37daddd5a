"""Find trace files, read them, and assemble one ``Trace`` per job.

One resolver serves the CLI, the app and batch: a file is a one-rank job; a
directory is one job whose ``*.json``/``*.json.gz`` files are its ranks.
"""

from __future__ import annotations

import gzip
import io
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from kinetoscope.analyze.ingest import scan
from kinetoscope.analyze.ingest.build import build_rank_trace
from kinetoscope.analyze.ingest.hangs import read_hang_dumps
from kinetoscope.analyze.ingest.jobs import (
    SIDECAR_SUFFIXES,
    TRACE_SUFFIXES,
    Job,
    TraceFile,
    find_jobs,
    is_capture_window,
    is_trace_file,
    list_folder,
    rank_from_name,
    resolve,
)
from kinetoscope.analyze.ingest.limits import (
    DEFAULT_LIMITS,
    GZIP_RATIO_AFTER_BYTES,
    LoadLimits,
    decompressed_too_large,
    fallback_too_large,
    file_too_large,
    inflates_too_much,
)
from kinetoscope.analyze.ingest.parser import launched_kernels, parse_bytes
from kinetoscope.analyze.ingest.raw import RawColumns, from_parsed
from kinetoscope.analyze.model.graphs import capture_table
from kinetoscope.analyze.model.hostfacts import count
from kinetoscope.analyze.model.schema import LAUNCH_KERNEL_COLUMNS
from kinetoscope.analyze.model.timeline import CAPTURE_BEGIN_RE
from kinetoscope.analyze.model.trace import RankTrace, Trace, training_children
from kinetoscope.errors import KinetoscopeError, TraceFormatError, TraceSourceError
from kinetoscope.manifest import ManifestFacts, ManifestWindows, StepTimes, Window, manifest_name, step_times_name
from kinetoscope.sources import trace_path

__all__ = ["SIDECAR_SUFFIXES", "TRACE_SUFFIXES", "Job", "find_jobs", "is_trace_file", "load_job", "load_job_tolerant",
           "load_rank", "load_trace", "rank_from_bytes", "rank_from_name", "read_bytes", "resolve"]

def read_bytes(path: TraceFile, limits: LoadLimits = DEFAULT_LIMITS, *, fallback: str | None = None) -> bytes:
    """The trace's JSON bytes, gunzipped when the file is gzip (by magic, not name), within the size limit.

    ``fallback``: the scanner's reason for handing the file to the reference decoder, which holds it whole:
    then only up to ``limits.max_fallback_bytes``."""
    cap = min(limits.max_decompressed_bytes, limits.max_fallback_bytes) if fallback else limits.max_decompressed_bytes
    try:
        size = path.stat().st_size
        if size > cap:
            raise (
                fallback_too_large(str(path), fallback, limits) if fallback else file_too_large(str(path), size, limits)
            )
        with path.open("rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TraceSourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        return _gunzip(data, str(path), limits, cap=cap, fallback=fallback)
    return data


_GUNZIP_BLOCK = 256 * 2**20


def _gunzip(
    data: bytes, source: str, limits: LoadLimits, *, cap: int | None = None, fallback: str | None = None
) -> bytes:
    """Decompress every gzip member, stopping as soon as the output passes the limit (gzip bombs).

    Reads in 256 MiB blocks: a trace smaller than that is never copied after decompression.
    """
    parts: list[bytes] = []
    total = 0
    limit = limits.max_decompressed_bytes if cap is None else cap
    try:
        raw = io.BytesIO(data)
        with gzip.GzipFile(fileobj=raw) as stream:
            while block := stream.read(min(_GUNZIP_BLOCK if total >= GZIP_RATIO_AFTER_BYTES else GZIP_RATIO_AFTER_BYTES,
                                           limit + 1 - total)):
                parts.append(block)
                total += len(block)
                refusal = inflates_too_much(source, total, raw.tell())
                if refusal is not None:
                    raise refusal
                if total > limit:
                    if fallback:
                        raise fallback_too_large(source, fallback, limits)
                    raise decompressed_too_large(source, limits)
    except EOFError:
        raise TraceFormatError(source, "corrupt or truncated gzip (the stream ends early)") from None
    except (OSError, zlib.error) as exc:
        raise TraceFormatError(source, f"corrupt or truncated gzip ({exc})") from None
    return b"".join(parts)


def load_rank(path: TraceFile, *, default_rank: int = 0, limits: LoadLimits = DEFAULT_LIMITS,
              cache: Path | None = None, ahead: scan.Ahead | None = None,
              after_parse: Callable[[], None] | None = None) -> RankTrace:
    """Load one rank file. Rank: distributedInfo, else ``rank-N`` in the name, else default.

    The file is streamed through the columnar scanner (bounded memory); the reference decoder
    takes over for anything the scanner leaves to it. With ``cache`` (a directory), a trace
    parsed before is reopened from its Parquet tables. ``ahead``: this file's scan, already started.
    ``after_parse``: called once the raw columns are dropped (the command's own process gives the C heap's free
    pages back there, ``kinetoscope.cli.process.give_back_free_memory``; the library leaves the heap alone).
    """
    started = time.perf_counter()
    key = None
    if cache is not None:
        from kinetoscope.analyze.ingest import cache as columnar

        key = columnar.key_for(path, default_rank)
        hit = columnar.load(key, cache)
        if hit is not None:
            return replace(hit, meta=replace(hit.meta, load_seconds=time.perf_counter() - started))
    try:
        scanned = ((ahead.result() if ahead is not None else scan.scan_file(path, limits))
                   or _reference(read_bytes(path, limits), path, limits))
    except scan.Unhandled as why:
        scanned = _reference(read_bytes(path, limits, fallback=str(why)), path, limits)
    trace = _rank_from_raw(*scanned, path, default_rank=default_rank, started=started)
    del scanned
    if after_parse is not None:
        after_parse()  # e.g. the raw columns' pages back, before the analyses allocate theirs
    if key is not None and cache is not None:
        columnar.save(trace, key, cache)
    return trace


def rank_from_bytes(data: bytes, path: TraceFile, *, default_rank: int = 0, started: float | None = None,
                    limits: LoadLimits = DEFAULT_LIMITS) -> RankTrace:
    """Build a rank from a trace's (already gunzipped) JSON bytes; ``path`` names it and locates sidecars."""
    started = time.perf_counter() if started is None else started
    try:
        scanned = scan.scan_bytes(data, str(path), limits) or _reference(data, path, limits)
    except scan.Unhandled as why:
        if len(data) > limits.max_fallback_bytes:
            raise fallback_too_large(str(path), str(why), limits) from None
        scanned = _reference(data, path, limits)
    del data
    return _rank_from_raw(*scanned, path, default_rank=default_rank, started=started)


def _reference(data: bytes, path: TraceFile, limits: LoadLimits) -> tuple[RawColumns, int]:
    """Columns from the reference decoder, for what the scanner leaves to it (and where it is not built)."""
    return from_parsed(parse_bytes(data, str(path), limits)), len(data)


def _rank_from_raw(raw: RawColumns, size: int, path: TraceFile, *, default_rank: int, started: float) -> RankTrace:
    dist = raw.metadata.get("distributedInfo")
    rank, rank_source = None, "default"
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        rank, rank_source = dist["rank"], "distributedInfo"
    if rank is None:
        named = rank_from_name(path)
        if named is not None:
            rank, rank_source = named, "filename"
    if rank is None:
        rank = default_rank
    trace = build_rank_trace(raw, source=str(path), rank=rank, rank_source=rank_source, bytes_read=size,
                             consume=True)  # the raw columns are dropped after this
    if trace.events.empty and trace.memory.empty:
        raise TraceFormatError(str(path), "trace holds no timed events (nothing to analyse)")
    run_steps, note = _run_steps(path, rank)
    notes: tuple[str, ...] = (note,) if note else ()
    launch_kernels = _captured_launch_kernels(trace, path)
    if launch_kernels is not None:
        trace = replace(trace, launch_kernels=launch_kernels)
    graph_captures, skipped = _graph_captures(path)
    notes += skipped
    manifest = _manifest_bytes(path, rank)  # read once: the window that was cut short, and the run's facts
    windows = _windows(manifest)  # decoded once: the window cut short, and the steps the capture exported in
    cut = _cut_short_step(path, windows)
    steps = trace.steps
    if cut is not None and len(steps) and (steps["step"] == cut[0]).any():
        steps = steps.assign(partial=steps["partial"].to_numpy() | (steps["step"] == cut[0]).to_numpy())
        notes += (f"ProfilerStep#{cut[0]} is partial: {cut[1]} before it completed (capture manifest); the window "
                  "leaves it out",)
    capture = _capture_facts(manifest)
    run_steps, bounded = _marks_within_walls(run_steps, (capture.get("loop") or {}).get("marks"))
    if bounded:
        notes += (bounded,)
    run_steps, shared = _shared_loader_waits(run_steps, capture.get("loop") or {})
    if shared:
        notes += (shared,)
    run_steps, own = _without_capture_steps(run_steps, windows)
    if own:
        notes += (own,)
    children = training_children(capture)
    if children is not None:
        notes += (f"the window holds no training steps: the training ran in {children[0]} Python child "
                  f"process{'es' if children[0] != 1 else ''} the capture does not follow (capture manifest)",)
    meta = replace(trace.meta, load_seconds=time.perf_counter() - started, warnings=trace.meta.warnings + notes,
                   capture=capture)
    trace = replace(trace, meta=meta, run_steps=run_steps, steps=steps)
    return trace if graph_captures is None else replace(trace, graph_captures=graph_captures)


#: the folder beside an execution trace where vLLM (``--profiler-config.capture_torch_profiler``) and SGLang
#: (``SGLANG_GRAPH_BATCH_CAPTURE``) write one trace per captured graph batch size
CAPTURE_TRACES_DIR = "capture_traces"


def _captured_launch_kernels(trace: RankTrace, path: TraceFile) -> pd.DataFrame | None:
    """The kernel and grid each launch call that ran nothing names in its args (``schema.LAUNCH_KERNEL_COLUMNS``),
    for a local trace holding a stream capture: read again from the file, as the columnar scan keeps no launch
    args; None where there is no capture or the file cannot be read again."""
    names = trace.events["name"].cat.categories
    if not isinstance(path, Path) or not any(CAPTURE_BEGIN_RE.match(str(n)) for n in names):
        return None
    try:
        named = launched_kernels(read_bytes(path))
    except (OSError, KinetoscopeError):
        return None
    ran = set(trace.gpu_events["correlation"].dropna().astype(int))
    rows = [(c, k, g) for c, (k, g) in named.items() if c not in ran]
    frame = pd.DataFrame(rows, columns=[c.name for c in LAUNCH_KERNEL_COLUMNS])
    return frame.astype({c.name: c.dtype for c in LAUNCH_KERNEL_COLUMNS})


def _graph_captures(path: TraceFile) -> tuple[pd.DataFrame | None, tuple[str, ...]]:
    """The launches of the graphs captured in the capture traces beside a local trace (``capture_traces/``), and a
    note for each one that could not be read; (None, ()) where there are none."""
    if not isinstance(path, Path) or path.parent.name == CAPTURE_TRACES_DIR:  # a capture trace itself: no sidecar
        return None, ()
    folder = path.parent / CAPTURE_TRACES_DIR
    try:
        listed = list_folder(folder) if folder.is_dir() else []
        files = [f for f, is_file in listed if is_trace_file(f, is_file=is_file)]
    except OSError:
        return None, ()
    frames, notes = [], []
    for f in files:
        try:
            frames.append(capture_table(load_rank(f), f.name))
        except KinetoscopeError as exc:
            notes.append(f"ignored {CAPTURE_TRACES_DIR}/{f.name}: {exc}")
    frames = [f for f in frames if len(f)]
    return (pd.concat(frames, ignore_index=True) if frames else None), tuple(notes)


def _manifest_bytes(path: TraceFile, rank: int) -> bytes | None:
    """The capture's manifest beside a captured trace (``rank-<r>.manifest.json``), if there is one."""
    if not is_capture_window(path):
        return None
    try:
        return path.with_name(manifest_name(rank)).read_bytes()
    except OSError:
        return None


def _windows(manifest_bytes: bytes | None) -> list[Window]:
    """The capture's windows as its manifest lists them; [] without a manifest or one that does not decode."""
    if manifest_bytes is None:
        return []
    try:
        return msgspec.json.decode(manifest_bytes, type=ManifestWindows).windows
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


def _cut_short_step(path: TraceFile, windows: list[Window]) -> tuple[int, str] | None:
    """(the step, why) when the capture's manifest says the process ended inside this trace's window: that
    step, open at the end, never completed (a crash, a signal, or the loop's end)."""
    for w in windows:
        if w.trace == path.name and w.cut_short:
            why = {"SIGTERM": "the process was stopped (SIGTERM)", None: "the run ended"}.get(
                w.ended_by, f"the script crashed ({w.ended_by})")
            return w.last_step, why
    return None


def _capture_facts(manifest_bytes: bytes | None) -> dict[str, Any]:
    """The host's CPUs, torch's threads, the DataLoader's configuration and the loop marks' totals from the
    capture's manifest."""
    if manifest_bytes is None:
        return {}
    try:
        facts = msgspec.json.decode(manifest_bytes, type=ManifestFacts)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    # one odd host field (a string, a bool, a list) is dropped, not the others with it
    host = {k: v for k, v in (facts.host or {}).items()
            if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}
    return {k: v for k, v in (("host", host), ("dataloader", _dataloader_facts(facts.dataloader)),
                              ("loop", _loop_facts(facts.loop)), ("world_size", count(facts.world_size)),
                              ("run", _run_facts(facts))) if v}


def _run_facts(facts: ManifestFacts) -> dict[str, Any] | None:
    """How the run ended, as the capture wrote it when the process stopped: the steps it timed, and what ended it
    early (an exception's name, a signal; None where the run ended); None where the manifest does not say."""
    steps = facts.steps_run
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        return None
    return {"steps_run": steps, "ended_by": facts.ended_by if isinstance(facts.ended_by, str) else None}


#: the hand-over probe's numbers (capture/handover.py): kept when each is a non-negative int or null
_PROBE_NUMBERS = ("median_ns", "p10_ns", "p90_ns", "samples", "batch_bytes", "workers")


def _dataloader_facts(dl: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's DataLoader configuration: its scalar settings, and the hand-over probe where its numbers are
    numbers (an odd field is dropped, not the others with it)."""
    if not dl:
        return None
    out: dict[str, Any] = {k: v for k, v in dl.items()
                           if k != "handover_probe" and (v is None or isinstance(v, (int, bool, str)))}
    probe = dl.get("handover_probe")
    if isinstance(probe, dict):
        numbers = {k: probe.get(k) for k in _PROBE_NUMBERS}
        if all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in numbers.values()):
            why = probe.get("why")
            out["handover_probe"] = {**numbers, "why": why if isinstance(why, str) else None}
    return out


def _loop_facts(loop: Any) -> dict[str, Any] | None:
    """The manifest's ``loop`` object as written (JSON data, never evaluated), when it is one: a dict naming its
    contract version (``marks``, an int) and the kinds it recorded (a list of strings)."""
    if not isinstance(loop, dict):
        return None
    version, recorded = loop.get("marks"), loop.get("recorded")
    if not isinstance(version, int) or isinstance(version, bool) or not isinstance(recorded, list) \
            or not all(isinstance(k, str) for k in recorded):
        return None
    return loop


def _marks_within_walls(run_steps: pd.DataFrame | None, marks_version: int | None) -> tuple[pd.DataFrame | None,
                                                                                           str | None]:
    """Captures whose loop marks are version 1 measured a step's validation, compile and checkpoint time between
    the recorder's boundaries, which hold the capture's own bookkeeping that the step's wall leaves out: a step
    wholly inside a validation read up to a few tens of microseconds more than its wall. Such a step's marked time
    is its wall (said in a note); version 2 writes it on the wall's clock."""
    if run_steps is None or marks_version != 1:
        return run_steps, None
    wall = run_steps["wall_ns"].to_numpy(np.float64)
    over = {k: run_steps[k].to_numpy(np.float64) > wall for k in ("validation_ns", "compile_ns", "checkpoint_ns")}
    n = int(np.logical_or.reduce(list(over.values())).sum())
    if not n:
        return run_steps, None
    fixed = run_steps.assign(**{k: np.where(o, wall, run_steps[k].to_numpy(np.float64)) for k, o in over.items()})
    return fixed, (f"{n} step{'s' if n != 1 else ''} of steps.json read more validation, compile or checkpoint time "
                   "than wall time (loop marks version 1 counted the capture's bookkeeping at each step boundary): "
                   "bounded by the step's wall")


def _shared_loader_waits(run_steps: pd.DataFrame | None, loop: dict[str, Any]) -> tuple[pd.DataFrame | None,
                                                                                          str | None]:
    """steps.json's ``train_data_wait_ns`` counts the waits of loaders whose final role is "train". A loader that
    trained (some of its batches were followed by a backward) but ended "unknown" holds training waits in no list,
    and the column would read 0 where the loop waited: such a capture's training waits are not known. The column is
    made null (the analysis falls back on every wait less the evaluation's: ``analyzers.loader._whole_run``) and a
    note says why (was: an Ignite run, whose evaluator iterated the training loader too, read 0 for 19.5% of its run
    in training waits; marks version 3 no longer makes that loader "unknown", but an unknown loader that trained
    still can be)."""
    if run_steps is None or "train_data_wait_ns" not in run_steps or run_steps["train_data_wait_ns"].isna().all():
        return run_steps, None
    shared = [x for x in loop.get("loaders") or [] if isinstance(x, dict) and x.get("role") == "unknown"
              and isinstance(x.get("batches_followed_by_backward"), int) and x["batches_followed_by_backward"] > 0]
    if not shared:
        return run_steps, None
    names = ", ".join(str(x.get("loader")) for x in shared)
    return run_steps.assign(train_data_wait_ns=np.nan), (
        f"the training loader's waits are not known: loader{'s' if len(shared) != 1 else ''} {names} trained but "
        "ended of unknown role (under half of the batches not taken for evaluation were followed by a backward), so "
        "steps.json's train_data_wait_ns, which counts train loaders only, is not read")


#: run_steps columns of the loop marks: nanoseconds (float64, NaN where not recorded) and counts (Int64, <NA>)
LOOP_NS_COLUMNS = ("train_data_wait_ns", "eval_data_wait_ns", "validation_ns", "compile_ns", "checkpoint_ns")
LOOP_COUNT_COLUMNS = ("backward_calls", "optimizer_steps")


def _without_capture_steps(run_steps: pd.DataFrame | None, windows: list[Window]) -> tuple[
        pd.DataFrame | None, str | None]:
    """The run's steps less those in which the capture itself wrote a trace (exporting it on the training thread,
    compressing it on its writer's thread): the capture's cost, not the training's, left out of every measure over
    the run (run time, run-queue wait, data wait) and said. Where the capture timed its own writing
    (``capture_busy_ns``), the steps it overlapped; before that, the step after each completed window, whose wall
    holds the export (the profiler exports at that step's start) - the compression after it was not timed, and the
    note says so. Nothing is left out where fewer than 2 steps would remain (and that is said)."""
    if run_steps is None or run_steps.empty:
        return run_steps, None
    busy = (run_steps["capture_busy_ns"].to_numpy(np.float64) if "capture_busy_ns" in run_steps
            else np.full(len(run_steps), np.nan))
    timed = not bool(np.isnan(busy).all())
    own: np.ndarray
    if timed:
        own = np.nan_to_num(busy) > 0
    else:
        exports = {w.last_step + 1 for w in windows if not w.cut_short and isinstance(w.last_step, int)}
        own = run_steps["step"].isin(sorted(exports)).to_numpy()
    n = int(own.sum())
    if not n:
        return run_steps, None
    steps = run_steps["step"].to_numpy()[own]
    if len(run_steps) - n < 2:  # too few steps would be left to measure the run by: kept, and said
        return run_steps, (f"the capture wrote its trace during {n} of the run's {len(run_steps)} steps: too many to "
                           "leave out, so the run's measures include its cost")
    wall_s = float(run_steps["wall_ns"].to_numpy()[own].sum()) / 1e9
    listed = ", ".join(str(int(x)) for x in steps[:8]) + (", ..." if n > 8 else "")
    note = (f"step{'s' if n > 1 else ''} {listed} ({wall_s:.2f} s) held the capture's own trace writing: left out of "
            "the run's measures (steps.json keeps them)")
    if not timed:
        note += ("; this capture did not time the compression that follows on its writer's thread, whose CPU the "
                 "next steps may share")
    return run_steps[~own].reset_index(drop=True), note


def _run_steps(path: TraceFile, rank: int) -> tuple[pd.DataFrame | None, str | None]:
    """The capture's always-on step timings beside a captured trace, if present."""
    if not is_capture_window(path):
        return None, None
    sidecar = path.with_name(step_times_name(rank))
    if not sidecar.is_file():
        return None, None
    try:
        times = msgspec.json.decode(sidecar.read_bytes(), type=StepTimes)
    except (OSError, msgspec.DecodeError) as exc:
        return None, f"ignored {sidecar.name}: {exc}"
    n = min(len(times.step_wall_ns), len(times.data_wait_ns))
    profiled = (list(times.profiled) + [False] * n)[:n]

    def optional(values: list) -> np.ndarray:  # CPU times: captures before they were recorded lack them
        out = np.full(n, np.nan)
        got = [np.nan if v is None else v for v in values[:n]]
        out[:len(got)] = got
        return out

    def counts(values: list[int] | None) -> pd.arrays.IntegerArray:
        out: list[int | None] = [None] * n
        for i, v in enumerate((values or [])[:n]):
            out[i] = v
        return pd.array(out, dtype="Int64")

    return pd.DataFrame({
        "step": np.arange(n, dtype=np.int64),
        "wall_ns": np.asarray(times.step_wall_ns[:n], dtype=np.int64),
        "data_wait_ns": np.asarray(times.data_wait_ns[:n], dtype=np.int64),
        "profiled": np.asarray(profiled, dtype=bool),
        "cpu_ns": optional(times.step_cpu_ns),
        "data_wait_cpu_ns": optional(times.data_wait_cpu_ns),
        "data_wait_thread_cpu_ns": optional(times.data_wait_thread_cpu_ns or []),
        "workers_cpu_ns": optional(times.workers_cpu_ns),
        # the capture's own trace writing inside the step: NaN where not recorded (captures before it)
        "capture_busy_ns": optional(times.capture_busy_ns or []),
        # the training thread's scheduler statistics: NaN where not recorded
        "oncpu_ns": optional(times.oncpu_ns or []),
        "runqueue_wait_ns": optional(times.runqueue_wait_ns or []),
        "involuntary_switches": optional(times.involuntary_switches or []),
        **{k: optional(getattr(times, k) or []) for k in LOOP_NS_COLUMNS},
        **{k: counts(getattr(times, k)) for k in LOOP_COUNT_COLUMNS},
    }), None


def load_trace(path: str | os.PathLike[str], limits: LoadLimits = DEFAULT_LIMITS, cache: Path | None = None, *,
               after_parse: Callable[[], None] | None = None) -> Trace:
    """Load one job: a trace file, or a directory holding that job's rank files."""
    return load_job(Job(str(path), tuple(resolve(path))), limits, cache, after_parse=after_parse)


def load_job(job: Job, limits: LoadLimits = DEFAULT_LIMITS, cache: Path | None = None, processes: int = 1,
             ahead: scan.Ahead | None = None, *, after_parse: Callable[[], None] | None = None,
             first_rank: int = 0) -> Trace:
    """Load a job's rank files; with ``processes`` > 1, ranks are parsed in parallel worker processes
    that hand back Parquet tables (the parent never holds a rank's raw JSON). ``ahead``: the scan of one of
    the job's files, already started (``scan.Ahead``). ``first_rank``: the rank a file that does not name its own
    takes, counted from the job's first file (a batch task loads one file of a job at a time)."""
    if not job.files:  # hang dumps alone: the job hung before a window was written
        return _assemble(job, [], limits)
    if processes > 1 and len(job.files) > 1:
        ranks = _load_in_processes(job, limits, processes)
    else:
        ranks = [load_rank(f, default_rank=first_rank + i, limits=limits, cache=cache,
                           ahead=ahead if ahead is not None and ahead.path == f and cache is None else None,
                           after_parse=after_parse)
                 for i, f in enumerate(job.files)]
    return _assemble(job, ranks, limits)


def _parse_to_parquet(path: str, default_rank: int, limits: LoadLimits, out: str) -> str:
    """Worker side of parallel loading: parse one rank and write it as columnar tables under ``out``."""
    from kinetoscope.analyze.ingest import cache as columnar

    key = f"rank-{default_rank}"
    columnar.save(load_rank(trace_path(path), default_rank=default_rank, limits=limits), key, Path(out))
    return key


def _load_in_processes(job: Job, limits: LoadLimits, processes: int) -> list[RankTrace]:
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    from kinetoscope.analyze.ingest import cache as columnar

    with tempfile.TemporaryDirectory(prefix="kinetoscope-ranks-") as tmp:
        # spawn, not fork: the caller may be a threaded app
        with ProcessPoolExecutor(max_workers=min(processes, len(job.files)),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            keys = list(pool.map(_parse_to_parquet, [str(f) for f in job.files], range(len(job.files)),
                                 [limits] * len(job.files), [tmp] * len(job.files)))
        ranks = [columnar.load(key, Path(tmp)) for key in keys]
    missing = [str(f) for f, r in zip(job.files, ranks, strict=False) if r is None]
    if missing:
        raise TraceSourceError(f"parallel load lost {', '.join(missing)}; rerun without --processes")
    return [r for r in ranks if r is not None]


def load_job_tolerant(job: Job, limits: LoadLimits = DEFAULT_LIMITS, *, after_parse: Callable[[], None] | None = None,
                      first_rank: int = 0) -> tuple[Trace | None, list[tuple[TraceFile, str]]]:
    """Load what can be loaded: broken rank files are returned as (path, reason), the rest form the Trace."""
    ranks: list[RankTrace] = []
    failed: list[tuple[TraceFile, str]] = []
    for i, f in enumerate(job.files):
        try:
            ranks.append(load_rank(f, default_rank=first_rank + i, limits=limits, after_parse=after_parse))
        except KinetoscopeError as exc:
            failed.append((f, str(exc)))
    if not ranks and not job.hang_dumps:
        return None, failed
    return _assemble(job, ranks, limits), failed


def _assemble(job: Job, ranks: list[RankTrace], limits: LoadLimits = DEFAULT_LIMITS) -> Trace:
    _check_distinct_ranks(ranks)
    return Trace(source=job.name, ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
                 hang_dumps=read_hang_dumps(job.hang_dumps, limits))


def _check_distinct_ranks(ranks: list[RankTrace]) -> None:
    seen: dict[int, RankTrace] = {}
    for r in ranks:
        other = seen.get(r.rank)
        if other is not None:
            raise TraceSourceError(
                f"{Path(other.meta.source).name} and {Path(r.meta.source).name} both claim rank {r.rank} "
                f"({other.meta.rank_source} / {r.meta.rank_source}); a directory must hold one job with one "
                "file per rank - analyse the files separately"
            )
        seen[r.rank] = r
