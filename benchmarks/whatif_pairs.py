"""What-if estimates against measured before/after runs: one knob changed per pair.

Each CPU pair runs ``benchmarks/whatif_train.py`` twice under ``kinetoscope capture`` (before, after), then
asks the *before* trace what fixing the finding the knob addresses is worth (``whatif.estimate`` with the
knob's value, e.g. num_workers=2), and compares with the *after* trace's measured mean step. The GPU pairs
are public V100 ResNet-50 traces (pytorch/kineto's samples, ``sample_traces/pairs``) recorded with
num_workers 0 and 4. Beside each prediction: the naive estimate (the finding's measured cost spread over the
steps, taken off the step), what the report gave before the replay.

Controls change something no finding addresses, or fix a finding that costs nothing on this machine: the
findings must claim at most 5% of the step.

Run: python benchmarks/whatif_pairs.py [--active 60] [--steps N] [--repeat 3] [--only NAME] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kinetoscope.analyze import whatif  # noqa: E402
from kinetoscope.analyze.ingest.loader import load_trace  # noqa: E402
from kinetoscope.analyze.report.builder import build_report  # noqa: E402

TRAIN = str(ROOT / "benchmarks" / "whatif_train.py")
PAIRS_DIR = ROOT / "sample_traces" / "pairs"

#: name, finding fixed, its parameters, before knobs, after knobs (added to before's)
CPU_PAIRS: list[tuple[str, str, dict[str, Any], list[str], list[str]]] = [
    ("num_workers 0 -> 2, slow storage", "loader_stall", {"num_workers": 2}, ["--io-ms", "20"], ["--workers", "2"]),
    ("num_workers 2 -> 4, slow storage", "loader_stall", {"num_workers": 4},
     ["--io-ms", "60", "--workers", "2"], ["--workers", "4"]),
    ("num_workers 0 -> 2, CPU-heavy decode (2 cores)", "loader_stall", {"num_workers": 2}, ["--cpu-ms", "15"],
     ["--workers", "2"]),
    ("num_workers 2 -> 4, CPU-heavy decode (2 cores)", "loader_stall", {"num_workers": 4},
     ["--cpu-ms", "30", "--workers", "2"], ["--workers", "4"]),
    ("prefetch_factor 1 -> 4, bursty storage", "loader_stall", {"num_workers": 2, "prefetch_factor": 4},
     ["--io-ms", "60", "--io-every", "6", "--workers", "2", "--prefetch", "1"], ["--prefetch", "4"]),
    ("persistent_workers off -> on, 8-batch epochs", "worker_respawn", {},
     ["--workers", "2", "--epoch-batches", "8", "--io-ms", "4"], ["--persistent"]),
]
#: controls: name, before knobs, after knobs (all of them; the findings of before must claim <= 5%)
CONTROLS: list[tuple[str, list[str], list[str]]] = [
    ("control: per-step .item() removed (CPU)", ["--item"], []),
    ("control: a slow custom op made fast", ["--slow-op-ms", "15"], []),
]
GPU_PAIRS = [
    ("GPU: V100 ResNet-50 num_workers 0 -> 4", ROOT / "sample_traces" / "real" / "v100_resnet50_2021.json.gz",
     PAIRS_DIR / "v100_resnet50_num_workers_4.json.gz", "loader_stall", {"num_workers": 4}),
    ("GPU: V100 ResNet-50 num_workers 0 -> 4, second run", PAIRS_DIR / "v100_resnet50_num_workers_0_run2.json.gz",
     PAIRS_DIR / "v100_resnet50_num_workers_4_run2.json.gz", "loader_stall", {"num_workers": 4}),
    ("GPU: V100 ResNet-50 (profiler API) num_workers 0 -> 4",
     PAIRS_DIR / "v100_resnet50_profiler_api_num_workers_0.json.gz",
     PAIRS_DIR / "v100_resnet50_profiler_api_num_workers_4.json.gz", "loader_stall", {"num_workers": 4}),
    ("GPU: V100 ResNet-50 (autograd API) num_workers 0 -> 4",
     PAIRS_DIR / "v100_resnet50_autograd_api_num_workers_0.json.gz",
     PAIRS_DIR / "v100_resnet50_autograd_api_num_workers_4.json.gz", "loader_stall", {"num_workers": 4}),
]


def median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def capture(out: Path, knobs: list[str], steps: int, active: int) -> Path:
    cmd = [sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), "--skip-first", "5", "--wait", "5",
           "--warmup", "2", "--active", str(active), "--no-telemetry", "--no-memory", "--", sys.executable, TRAIN,
           "--steps", str(steps), *knobs]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"capture failed: {' '.join(knobs)}\n{proc.stderr[-2000:]}")
    return out


def mean_step_us(report: Any) -> float:
    return float(report.ranks[0]["steps"]["mean_us"])


def predict(before: Path, fid: str, params: dict[str, Any]) -> tuple[float, float | None, float | None, str]:
    """(measured before, predicted after, naive after, what was found) for fixing ``fid`` in ``before``."""
    trace = load_trace(before)
    report = build_report(trace)
    base = mean_step_us(report)
    found = [f for f in report.findings if f.id == fid]
    if not found:
        return base, None, None, f"no {fid} finding (" + ", ".join(f.id for f in report.findings) + ")"
    f = found[0]
    est = whatif.estimate(trace.rank(f.rank or 0), f, params)
    steps = report.ranks[0]["steps"]["count"]
    naive = base - f.impact_us / steps
    return base, (est or {}).get("step_us_after"), naive, f"{f.id} ({f.severity})"


def control(before: Path) -> tuple[float, float, str]:
    """(measured before, the largest saving any finding claims as a share of the step, which one)."""
    trace = load_trace(before)
    report = build_report(trace)
    claims = [((f.estimate or {}).get("saving_fraction") or 0.0, f.id) for f in report.findings]
    share, fid = max(claims, default=(0.0, "no findings"))
    return mean_step_us(report), share, fid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--active", type=int, default=60, help="profiled steps per run (default 60: a bursty loader's "
                    "pattern repeats a few times in 20, and its mean moved by 10-15%% between runs)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run (default: the profiled ones + 20, at least 60)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side; medians are reported (default 3)")
    ap.add_argument("--only", default=None, help="run the pairs whose name contains this")
    ap.add_argument("--keep", type=Path, default=None, help="keep the captures here")
    args = ap.parse_args()
    args.steps = args.steps or max(60, args.active + 20)  # 5 skipped, 5 waited, 2 warm-up, then the profiled ones
    work = args.keep or Path(tempfile.mkdtemp(prefix="kinetoscope-whatif-"))
    rows: list[dict[str, Any]] = []
    try:
        for i, (name, fid, params, before_k, after_k) in enumerate(CPU_PAIRS):
            if args.only and args.only not in name:
                continue
            runs = []
            for rep in range(args.repeat):  # this VM's step times drift by 10-50% between runs: a median of runs
                b = capture(work / f"pair{i}-before-{rep}", before_k, args.steps, args.active)
                a = capture(work / f"pair{i}-after-{rep}", before_k + after_k, args.steps, args.active)
                runs.append((*predict(b, fid, params), mean_step_us(build_report(load_trace(a)))))
            preds = [r[1] for r in runs if r[1] is not None]
            naives = [r[2] for r in runs if r[2] is not None]
            rows.append({"pair": name, "finding": runs[0][3], "before_ms": median([r[0] for r in runs]) / 1000,
                         "predicted_ms": median(preds) / 1000 if preds else None,
                         "measured_ms": median([r[4] for r in runs]) / 1000,
                         "naive_ms": median(naives) / 1000 if naives else None, "runs": len(runs)})
        for name, b, a, fid, params in GPU_PAIRS:
            if args.only and args.only not in name:
                continue
            base, pred, naive, what = predict(b, fid, params)
            rows.append({"pair": name, "finding": what, "before_ms": base / 1000, "predicted_ms": pred and pred / 1000,
                         "measured_ms": mean_step_us(build_report(load_trace(a))) / 1000,
                         "naive_ms": naive and naive / 1000})
        for i, (name, before_k, after_k) in enumerate(CONTROLS):
            if args.only and args.only not in name:
                continue
            runs = []
            for rep in range(args.repeat):
                b = capture(work / f"control{i}-before-{rep}", before_k, args.steps, args.active)
                a = capture(work / f"control{i}-after-{rep}", after_k, args.steps, args.active)
                runs.append((*control(b), mean_step_us(build_report(load_trace(a)))))
            worst = max(runs, key=lambda r: r[1])
            rows.append({"pair": name, "finding": f"largest claim: {worst[2]}",
                         "before_ms": median([r[0] for r in runs]) / 1000,
                         "claimed_fraction": worst[1], "measured_ms": median([r[3] for r in runs]) / 1000})
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("| pair | finding fixed | before ms | predicted ms | measured ms | error | naive ms | naive error |")
    print("|---|---|---|---|---|---|---|---|")
    errors, naive_errors = [], []
    for r in rows:
        m = r["measured_ms"]
        if "claimed_fraction" in r:
            print(f"| {r['pair']} | {r['finding']} | {r['before_ms']:.2f} | claims {r['claimed_fraction']:.1%} of the "
                  f"step | {m:.2f} | | | |")
            continue
        p, n = r["predicted_ms"], r["naive_ms"]
        err = (p - m) / m if p is not None else None
        nerr = (n - m) / m if n is not None else None
        if err is not None:
            errors.append(abs(err))
        if nerr is not None:
            naive_errors.append(abs(nerr))
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        pct = lambda v: "n/a" if v is None else f"{v:+.1%}"  # noqa: E731
        print(f"| {r['pair']} | {r['finding']} | {r['before_ms']:.2f} | {fmt(p)} | {m:.2f} | {pct(err)} | {fmt(n)} | "
              f"{pct(nerr)} |")
    if errors:
        errors.sort()
        naive_errors.sort()
        mid = len(errors) // 2
        med = errors[mid] if len(errors) % 2 else sum(errors[mid - 1:mid + 1]) / 2
        print(f"\npairs: {len(errors)}; median |error| {med:.1%}, worst {errors[-1]:.1%}; naive: median "
              f"{naive_errors[len(naive_errors) // 2]:.1%}, worst {naive_errors[-1]:.1%}")
    json.dump(rows, sys.stderr, indent=1)


if __name__ == "__main__":
    main()
