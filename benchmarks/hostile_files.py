"""Time and peak memory of refusing each hostile file, at default limits, as a user runs it.

Writes the corpus of tests/hostile.py (plus a gzip bomb of zeros: 2 MB that gunzips to 2 GB) and runs
`kinetoscope analyze FILE` on each in its own process, reporting wall time, the child's peak RSS (VmHWM)
and the first line of the message. Goal (issue 16): every one refused within 2 s and 300 MB.
Run: python benchmarks/hostile_files.py [--out DIR]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hostile import write_corpus  # noqa: E402


def zero_bomb(path: Path, gunzipped: int = 2 * 2**30) -> None:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * 2**22
    with open(path, "wb") as fh:
        for _ in range(gunzipped // len(block)):
            fh.write(comp.compress(block))
        fh.write(comp.flush())


def run(path: Path) -> tuple[float, float, int, str]:
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", str(path)],
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far: run the largest last, or read per run
    message = (proc.stderr.strip().splitlines() or [""])[0][:110]
    return wall, max(peak, before) / 1024, proc.returncode, message


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="kinetoscope-hostile-"))
    corpus = write_corpus(folder)
    zero_bomb(folder / "zeros_bomb.json.gz")
    names = sorted(corpus) + ["zeros_bomb.json.gz"]
    print("| file | size | exit | wall s | peak RSS MB | message |")
    print("|---|---|---|---|---|---|")
    for name in names:
        path = folder / name
        # each file in a fresh interpreter whose own peak is measured
        code = ("import resource,subprocess,sys,time;t=time.perf_counter();"
                "p=subprocess.run([sys.executable,'-m','kinetoscope.cli','analyze',sys.argv[1]],"
                "capture_output=True,text=True);"
                "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024, "
                "p.returncode);"
                "print((p.stderr.strip().splitlines() or [''])[0][:110])")
        out = subprocess.run([sys.executable, "-c", code, str(path)],
                             capture_output=True, text=True, timeout=900).stdout
        first, message = (out.splitlines() + ["", ""])[:2]
        wall, peak, rc = first.split()
        print(f"| {name} | {path.stat().st_size:,} | {rc} | {float(wall):.2f} | {float(peak):.0f} | {message} |")


if __name__ == "__main__":
    main()
